"""Issue 8's workload 5, second half: how long a 3-replica pchannel cannot take writes when
its leader is killed and stays down.

An embedded cluster (a coord and 3 node processes, `LocalCluster`) holds one pchannel
with 3 replicas; a routed producer (`streamwal.client.connect`, as an application would
use) keeps 4 sends in flight at the default ack level (QUORUM). Each round waits for all
replicas to be in step, SIGKILLs the leader, and records the window from the kill to the
first acknowledgement of a message sent after the kill (an ack already on its way from
the dead leader does not count); then the killed node is started again and rejoins as
a follower. The coord runs with the defaults the chart ships (probes every `PROBE_S`,
lost after `GRACE_S`): a killed node's ports refuse connections, so the coord knows it
dead at its next status probe and ping (coord/liveness.py) and fails the leadership over
at once -- the two survivors are a quorum, so the failover is clean -- without waiting
the grace. The window is that detection plus fencing the survivors, choosing and
assigning the new leader, plus the client finding it. At the end every replica's
log is read back and checked against the acknowledgements (streamwal.testing.history):
a window bought by losing messages would not count.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL
from streamwal.errors import StreamingError
from streamwal.testing.history import Acked, check, payload

T = TypeVar("T")
IN_FLIGHT = 4
PROBE_S = DEFAULT_PROBE_INTERVAL
GRACE_S = DEFAULT_GRACE


class _Sender:
    """Keeps `IN_FLIGHT` sends going (one lane each, numbered messages in order); remembers
    (sent, acked) and the offset of every acknowledged one."""

    def __init__(self, producer) -> None:
        self.producer = producer
        self.acks: list[tuple[float, float]] = []
        self.acked: list[Acked] = []
        self.failed = 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._lane(f"lane{i}")) for i in range(IN_FLIGHT)]

    async def _lane(self, lane: str) -> None:
        index = 0
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                result = await self.producer.send(payload(lane, index))
                self.acks.append((sent, time.monotonic()))
                self.acked.append(Acked(lane, index, result.offset))
            except StreamingError:
                self.failed += 1
                await asyncio.sleep(0.01)
            index += 1

    def first_ack_after(self, moment: float) -> float | None:
        later = [acked for sent, acked in self.acks if sent > moment]
        return min(later) - moment if later else None

    async def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        await asyncio.wait(self._tasks, timeout=30)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # a saturated cluster may not answer the close in time: what it acknowledged
        # is already counted, the rest never was
        with contextlib.suppress(StreamingError, TimeoutError):
            await asyncio.wait_for(self.producer.close(), 10)


async def _read_back(read: Callable[[], Awaitable[T]], timeout: float) -> T:
    """`read()`, again while a node just restarted does not answer yet (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await read()
        except StreamingError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


async def failover_windows(
    workdir: Path, kills: int, tick: Callable[[str], None] | None = None
) -> dict:
    """Kill the leader `kills` times; the unavailability windows and how they were made."""
    from streamwal.client.wal import open_wal
    from streamwal.testing.local_cluster import LocalCluster
    from streamwal.testing.replica_logs import read_replicas

    cluster = LocalCluster(
        workdir, nodes=3, probe_interval=PROBE_S, grace=GRACE_S, log_level="warning"
    )
    windows: list[float] = []
    wal = sender = None
    try:
        await cluster.start()
        (name,) = await cluster.create_channels(1, prefix="failover", replicas=3)
        wal = await open_wal(cluster.coord_address, failover_timeout=45)
        await wal.resolve(name, timeout=30)
        sender = _Sender(await wal.producer(name))
        for _ in range(kills):
            await _until(lambda: cluster.replicas_healthy(name, max_lag=1000), 60, "replicas")
            moment = time.monotonic()
            await _until(lambda m=moment: sender.first_ack_after(m) is not None, 30, "ack")
            leader = (await cluster.describe())[name].meta.node.server_id
            cluster.kill_node(leader)
            killed_at = time.monotonic()
            await _until(lambda k=killed_at: sender.first_ack_after(k) is not None, 60, "ack")
            windows.append(sender.first_ack_after(killed_at))
            await cluster.start_node(leader)  # back as a follower before the next round
            if tick is not None:
                tick(f"failover {len(windows)}/{kills}: {windows[-1]:.2f} s")
        await sender.close()
        await _until(lambda: cluster.replicas_healthy(name, max_lag=1000), 60, "replicas")
        members = {m.server_id: m.address for m in (await cluster.describe())[name].members}
        logs = await _read_back(lambda: read_replicas(members, name), 30)
        verdict = check(logs, sender.acked)
    finally:
        if sender is not None:
            await sender.close()
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
        await cluster.close()
    return {
        "kills": kills,
        "probe_interval_s": PROBE_S,
        "grace_s": GRACE_S,
        "windows_s": [round(w, 3) for w in windows],
        "median_s": statistics.median(windows),
        "max_s": max(windows),
        "acked": len(sender.acks),
        "failed_sends": sender.failed,
        "history_ok": verdict.ok,
        "violations": dict(verdict.counts),
    }
