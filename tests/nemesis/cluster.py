"""The cluster the nemesis tests break: `LocalCluster` with per-node flags, environment
and network namespace, plus what the tests ask of the coord (who leads, is it healthy)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from grpc import aio

from streamwal.errors import Unavailable
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.history import Acked, Verdict, check
from streamwal.testing.local_cluster import LocalCluster
from streamwal.testing.local_node import LocalNode
from streamwal.testing.replica_logs import read_replicas
from tests.nemesis import faults
from tests.support import wait_for

ASSIGNED = pb.PCHANNEL_META_STATE_ASSIGNED


class NemesisCluster(LocalCluster):
    """A LocalCluster whose nodes may have their own flags, environment (a shifted clock)
    and network namespace (`network`: node i is host i); the coord stays in the root
    namespace, where it reaches every node over the bridge."""

    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        *,
        node_args: tuple[str, ...] = (),
        node_env: dict[int, dict[str, str]] | None = None,
        network: faults.Network | None = None,
        **kwargs,
    ) -> None:
        super().__init__(root, nodes, **kwargs)
        self.network = network
        for i in self.node_ids:
            self.nodes[i] = LocalNode(
                self.root / f"node{i}",
                node_id=i,
                host=network.address(i) if network else "127.0.0.1",
                extra_args=("--log-level", self.log_level, *node_args),
                env=(node_env or {}).get(i),
            )

    async def start_node(self, node_id: int) -> LocalNode:
        node = self.nodes[node_id]
        if self.network is None:
            return await asyncio.to_thread(node.start)
        return await asyncio.to_thread(self.network.run_in, node_id, node.start)

    def data_dir(self, node_id: int) -> Path:
        return self.nodes[node_id].data_dir

    def pause_coord(self) -> None:
        faults.pause(self.coord_proc)

    def resume_coord(self) -> None:
        faults.resume(self.coord_proc)

    def logs_tail(self, chars: int = 3000) -> str:
        parts = [f"--- coord log ---\n{self.coord_log_tail(chars)}"]
        for i, node in self.nodes.items():
            parts.append(f"--- node {i} log ({node.log_path}) ---\n{node.log_tail(chars)}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- questions

    async def leader(self, name: str) -> int | None:
        """The node serving `name` now (None while it is not ASSIGNED)."""
        d = (await self.describe())[name]
        return d.meta.node.server_id if d.meta.state == ASSIGNED else None

    async def term(self, name: str) -> int:
        return (await self.describe())[name].meta.channel.term

    async def healthy(self, name: str) -> bool:
        with contextlib.suppress(aio.AioRpcError, KeyError):
            d = (await self.describe())[name]
            if d.replicas > 1:
                return await self.replicas_healthy(name)
            return d.meta.state == ASSIGNED
        return False

    async def caught_up(self, name: str, max_lag: int = 1000) -> bool:
        """Healthy, and every follower within `max_lag` records of the leader."""
        with contextlib.suppress(aio.AioRpcError, KeyError):
            return await self.replicas_healthy(name, max_lag)
        return False

    async def wait_healthy(self, names: list[str], timeout: float = 30.0) -> None:
        for name in names:
            try:
                await wait_for(lambda n=name: self.healthy(n), timeout, 0.1, f"{name} healthy")
            except TimeoutError:
                with contextlib.suppress(aio.AioRpcError):
                    described = (await self.describe()).get(name)
                raise AssertionError(f"{name} not healthy after {timeout}s: {described}") from None

    async def check(
        self, name: str, acked: list[Acked], seen: list[tuple[int, bytes]] = ()
    ) -> Verdict:
        """The replication checker over every member's log of `name`. A node restarted a
        moment ago may still be in gRPC's reconnect backoff (subchannels are shared):
        reads are retried for a bounded time."""
        d = (await self.describe())[name]
        members = {m.server_id: m.address for m in d.members} or {
            d.meta.node.server_id: d.meta.node.address
        }
        deadline = time.monotonic() + 30
        while True:
            try:
                logs = await asyncio.wait_for(read_replicas(members, name), 30)
                return check(logs, acked, seen)
            except TimeoutError:
                raise AssertionError(f"reading the replicas of {name} stalled for 30s") from None
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


class LeaderWatch:
    """Polls who leads each of `names` until stopped: every (time, pchannel, node, term)
    seen, to assert who never led."""

    def __init__(self, cluster: NemesisCluster, names: list[str], interval: float = 0.1) -> None:
        self.cluster = cluster
        self.names = names
        self.interval = interval
        self.seen: list[tuple[float, str, int, int]] = []
        self._task: asyncio.Task | None = None

    def start(self) -> LeaderWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(aio.AioRpcError):
                described = await self.cluster.describe()
                for name in self.names:
                    d = described.get(name)
                    if d is not None and d.meta.state == ASSIGNED:
                        entry = (d.meta.node.server_id, d.meta.channel.term)
                        if not any((s[2], s[3]) == entry for s in self.seen if s[1] == name):
                            self.seen.append((time.monotonic(), name, *entry))
            await asyncio.sleep(self.interval)

    def led_by(self, node: int, since: float = 0.0) -> list[tuple[str, int]]:
        """(pchannel, term) that `node` led since `since`."""
        return [(name, term) for t, name, n, term in self.seen if n == node and t >= since]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
