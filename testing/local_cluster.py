"""A coord and N streaming nodes as local child processes: `streamwal dev` and tests use it.

Nodes bind port 0 and report their port through a port file (`LocalNode`); a restarted
node binds the same port again, as a StatefulSet pod keeps its name. The coord gets a
free loopback port and is ready once its health service says SERVING. Every process is
SIGKILLed by `close()`, which callers run in a `finally` (also on Ctrl-C).
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

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamwal import transport
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import LocalNode, free_port

__all__ = ["LocalCluster", "free_port"]


class LocalCluster:
    """Nodes 1..N and one coord under `root`; stable node ids and addresses."""

    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        probe_interval: float = 0.25,
        grace: float = 1.5,
        coord_args: tuple[str, ...] = (),
        log_level: str = "info",  # the nodes'
        coord_address: str | None = None,  # default: a free loopback port
        node_args: tuple[str, ...] = (),
        node_env: dict[str, str] | None = None,
        transport: transport.TransportConfig | None = None,  # the cluster's own calls
    ) -> None:
        self.root = Path(root)
        self.node_ids = list(range(1, nodes + 1))
        self.probe_interval = probe_interval
        self.grace = grace
        self.coord_args = coord_args
        self.log_level = log_level
        self.node_args = node_args
        self.node_env = node_env
        self.transport = transport
        self.nodes: dict[int, LocalNode] = {}
        self.coord_proc: subprocess.Popen | None = None
        self.coord_address = coord_address or f"127.0.0.1:{free_port()}"
        self.coord_log = self.root / "coord.log"
        self._channel: aio.Channel | None = None

    # ----------------------------------------------------------------- processes

    def _node(self, node_id: int) -> LocalNode:
        node = self.nodes.get(node_id)
        if node is None:
            node = self.nodes[node_id] = LocalNode(
                self.root / f"node{node_id}",
                node_id=node_id,
                extra_args=("--log-level", self.log_level, *self.node_args),
                env=self.node_env,
            )
        return node

    async def start_node(self, node_id: int) -> LocalNode:
        """Start (or restart, on the same data and port) node `node_id`."""
        return await asyncio.to_thread(self._node(node_id).start)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: no goodbye, no flush beyond what the node already made durable."""
        self.nodes[node_id].kill()

    def node_address(self, node_id: int) -> str:
        return self.nodes[node_id].address

    async def start_coord(self, env: dict[str, str] | None = None) -> None:
        nodes = ",".join(f"{i}={self.node_address(i)}" for i in self.node_ids)
        argv = [
            sys.executable, "-m", "streamwal", "coord",
            "--listen", self.coord_address,
            "--meta-dir", str(self.root / "meta"),
            "--nodes", nodes,
            "--probe-interval", str(self.probe_interval),
            "--grace", str(self.grace),
            "--log-level", "info",  # its assignment events are what `coord_events` reads
            *self.coord_args,
        ]  # fmt: skip
        with open(self.coord_log, "ab") as log:
            self.coord_proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        await self._wait_coord(30.0)

    def kill_coord(self) -> None:
        """SIGKILL the coord (start it again with `start_coord`)."""
        if self.coord_proc is not None and self.coord_proc.poll() is None:
            self.coord_proc.send_signal(signal.SIGKILL)
            self.coord_proc.wait(10)

    async def _wait_coord(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        stub = health_pb2_grpc.HealthStub(self.channel())
        while time.monotonic() < deadline:
            if self.coord_proc is not None and self.coord_proc.poll() is not None:
                raise RuntimeError(f"coord exited at start:\n{self.coord_log_tail()}")
            with contextlib.suppress(aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"coord not serving after {timeout}s:\n{self.coord_log_tail()}")

    async def start(self) -> LocalCluster:
        """Every node (in parallel), then the coord; what started is stopped again when
        a part fails (a caller whose start raised never gets a cluster to close)."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.gather(*(self.start_node(i) for i in self.node_ids))
            await self.start_coord()
        except BaseException:
            await self.close()
            raise
        return self

    def coord_log_tail(self, chars: int = 4000) -> str:
        try:
            return self.coord_log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def coord_events(self, *messages: str) -> list[dict]:
        """The coord's structured log lines whose `msg` is one of `messages`."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.coord_log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("msg") in messages:
                        out.append(event)
        return out

    # ----------------------------------------------------------------- coord calls

    def channel(self) -> aio.Channel:
        if self._channel is None:
            self._channel = transport.make_channel(self.coord_address, self.transport)
        return self._channel

    async def create_channels(
        self,
        count: int,
        prefix: str = "",
        replicas: int = 1,
        allow_data_loss: bool = False,
        timeout: float = 10.0,
    ) -> list[str]:
        stub = cpbg.StreamingCoordChannelServiceStub(self.channel())
        reply = await stub.CreateChannels(
            cpb.CreateChannelsRequest(
                owner=cpb.OwnerDescription(role="dev"),
                num_channels=count,
                prefix=prefix,
                replicas=replicas,
                allow_data_loss=allow_data_loss,
            ),
            timeout=timeout,
        )
        return list(reply.channel_names)

    async def describe(self) -> dict[str, cpb.ChannelDescription]:
        stub = cpbg.StreamingCoordChannelServiceStub(self.channel())
        reply = await stub.DescribeChannels(cpb.DescribeChannelsRequest(), timeout=5)
        return {d.channel_name: d for d in reply.descriptions}

    async def replicas_healthy(
        self, name: str, max_lag: int = 50_000, without: int | None = None
    ) -> bool:
        """ASSIGNED with every replica, and the leader reports each follower within
        `max_lag` records: ready for the next fault. `without`: a killed member that
        does not count (it stays a member until its grace runs out)."""
        d = (await self.describe())[name]
        if d.meta.state != pb.PCHANNEL_META_STATE_ASSIGNED or len(d.members) < d.replicas:
            return False
        followers = {m.server_id for m in d.members} - {d.meta.node.server_id, without}
        progress = {p.node_id: p for p in d.progress}
        return followers <= set(progress) and all(progress[f].lag < max_lag for f in followers)

    async def drain(self, node_id: int, undrain: bool = False) -> None:
        stub = cpbg.StreamingCoordChannelServiceStub(self.channel())
        await stub.DrainNode(cpb.DrainNodeRequest(server_id=node_id, undrain=undrain), timeout=5)

    # ----------------------------------------------------------------- teardown

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every process this cluster started (safe to call twice)."""
        for node in self.nodes.values():
            node.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.kill_coord()

    async def __aenter__(self) -> LocalCluster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()
