"""Real-process fixtures for coord tests: streaming nodes and a coord on loopback ports.

Every process started here is SIGKILLed at teardown, also when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamwal import transport
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.testing.local_node import free_port

STREAMWAL = str(Path(sys.executable).parent / "streamwal")


async def wait_serving(address: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Poll the standard health service until SERVING (or the process died)."""
    deadline = time.monotonic() + timeout
    async with transport.make_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"process for {address} exited with {proc.returncode}")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{address} not serving after {timeout}s")


class Cluster:
    """Nodes with stable ids/ports (restarts reuse them) and one coord at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node_ports: dict[int, int] = {}
        self.nodes: dict[int, subprocess.Popen] = {}
        self.coord_proc: subprocess.Popen | None = None
        self.coord_port = free_port()
        self.coord_address = f"127.0.0.1:{self.coord_port}"
        self.coord_log = root / "coord.log"
        self._all: list[subprocess.Popen] = []
        self._channel: aio.Channel | None = None

    free_port = staticmethod(free_port)

    async def cli(self, *args: str) -> str:
        """Run `streamwal ARGS`; returns stdout, raises AssertionError(stderr) on failure."""
        proc = await asyncio.create_subprocess_exec(
            STREAMWAL,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.root,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        if proc.returncode != 0:
            raise AssertionError(err.decode())
        return out.decode()

    def node_address(self, node_id: int) -> str:
        if node_id not in self.node_ports:
            self.node_ports[node_id] = free_port()
        return f"127.0.0.1:{self.node_ports[node_id]}"

    def _spawn(
        self, args: list[str], log: Path, env: dict[str, str] | None = None, crash_at: str = ""
    ):
        # With `crash_at`, the coord SIGKILLs itself right after that step (testing/crash.py).
        crash = [sys.executable, "-m", "streamwal.testing.crash", "--at", crash_at, "--"]
        with open(log, "ab") as err:
            proc = subprocess.Popen(
                [*(crash if crash_at else [STREAMWAL]), *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=self.root,
                env={**os.environ, **(env or {})},
            )
        self._all.append(proc)
        return proc

    async def start_node(self, node_id: int) -> None:
        address = self.node_address(node_id)
        proc = self._spawn(
            [
                "node",
                "--listen",
                address,
                "--data-dir",
                str(self.root / f"node{node_id}"),
                "--node-id",
                str(node_id),
            ],
            self.root / f"node{node_id}.log",
        )
        self.nodes[node_id] = proc
        await wait_serving(address, proc)

    def kill_node(self, node_id: int) -> None:
        proc = self.nodes.pop(node_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    async def start_coord(
        self,
        node_ids,
        *args: str,
        env: dict[str, str] | None = None,
        wait: bool = True,
        crash_at: str = "",
    ) -> subprocess.Popen:
        nodes = ",".join(f"{i}={self.node_address(i)}" for i in node_ids)
        proc = self._spawn(
            [
                "coord",
                "--listen",
                self.coord_address,
                "--meta-dir",
                str(self.root / "meta"),
                "--nodes",
                nodes,
                "--probe-interval",
                "0.25",
                "--grace",
                "1.0",
                *args,
            ],
            self.coord_log,
            env,
            crash_at,
        )
        self.coord_proc = proc
        if wait:
            await wait_serving(self.coord_address, proc)
        return proc

    def kill_coord(self) -> None:
        if self.coord_proc is not None:
            self.coord_proc.send_signal(signal.SIGKILL)
            self.coord_proc.wait(timeout=10)
            self.coord_proc = None

    def channel(self) -> aio.Channel:
        if self._channel is None:
            self._channel = transport.make_channel(self.coord_address)
        return self._channel

    def stub(self) -> cpbg.StreamingCoordChannelServiceStub:
        return cpbg.StreamingCoordChannelServiceStub(self.channel())

    async def create(
        self, count: int, prefix: str = "", replicas: int = 1, allow_data_loss: bool = False
    ) -> list[str]:
        reply = await self.stub().CreateChannels(
            cpb.CreateChannelsRequest(
                owner=cpb.OwnerDescription(role="test"),
                num_channels=count,
                prefix=prefix,
                replicas=replicas,
                allow_data_loss=allow_data_loss,
            ),
            timeout=10,
        )
        return list(reply.channel_names)

    async def describe(self) -> dict[str, cpb.ChannelDescription]:
        reply = await self.stub().DescribeChannels(cpb.DescribeChannelsRequest(), timeout=5)
        return {d.channel_name: d for d in reply.descriptions}

    async def all_assigned(self, names, avoid: set[int] = frozenset()):
        """The descriptions once every name is ASSIGNED on a node outside `avoid`, else None."""
        try:
            described = await self.describe()
        except aio.AioRpcError:
            return None
        from streamwal.coord import state_machine as sm

        for name in names:
            d = described.get(name)
            if d is None or d.meta.state != sm.ASSIGNED or d.meta.node.server_id in avoid:
                return None
        return described

    def coord_events(self, msg: str) -> list[dict]:
        out = []
        for line in self.coord_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("msg") == msg:
                out.append(event)
        return out

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        for proc in self._all:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self._all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
