"""Issue 5's fault test: a 3-replica pchannel keeps every quorum-acknowledged message through
20+ SIGKILLs (the leader about 2 times in 3) with restarts, and a paused old leader that
wakes up after a new term neither accepts nor exposes anything.

Real processes: a coord and 3 nodes (`LocalCluster`), idempotent routed producers at the
default ack level (QUORUM for replicas > 1), a routed consumer reading throughout. After
the faults the producers stop, the replicas catch up, and every replica's log, read through
Fetch, is checked (`streamwal.testing.history`) against what was acknowledged and consumed.
Prints each failover's unavailability window: from the kill to the first quorum ack after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.client.routing import RoutedConsumer, RoutedProducer
from streamwal.client.wal import WAL, open_wal
from streamwal.errors import StreamingError
from streamwal.testing.history import Acked, check, payload
from streamwal.testing.local_cluster import LocalCluster
from streamwal.testing.replica_logs import read_replicas
from tests.support import wait_for

KILLS = int(os.environ.get("STREAMWAL_FAULT_KILLS", "20"))
PRODUCERS = 2
WINDOW = 8  # sends in flight per producer
GRACE = 1.0
PROBE = 0.2
SEED = int(os.environ.get("STREAMWAL_FAULT_SEED", str(int(time.time()))))


@dataclass
class Workload:
    """Producers sending `name:index` payloads until stopped; every ack is recorded."""

    wal: WAL
    pchannel: str
    acked: list[Acked] = field(default_factory=list)
    ack_times: list[tuple[float, float]] = field(default_factory=list)  # (sent, acked)
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    producers: list[RoutedProducer] = field(default_factory=list)

    async def start(self) -> None:
        for p in range(PRODUCERS):
            name = f"p{p}"
            producer = await self.wal.producer(self.pchannel, producer_id=f"fault-{name}")
            self.producers.append(producer)
            self.tasks.append(asyncio.create_task(self._run(name, producer)))

    async def _run(self, name: str, producer: RoutedProducer) -> None:
        slots = asyncio.Semaphore(WINDOW)
        index = 0

        async def one(i: int) -> None:
            sent = time.monotonic()
            try:
                result = await producer.send(payload(name, i))
                self.acked.append(Acked(name, i, result.offset))
                self.ack_times.append((sent, time.monotonic()))
            except StreamingError:
                self.failed += 1
            finally:
                slots.release()

        sends = set()
        while not self.stop.is_set():
            await slots.acquire()
            if self.stop.is_set():
                slots.release()
                break
            task = asyncio.create_task(one(index))
            sends.add(task)
            task.add_done_callback(sends.discard)
            index += 1
        if sends:
            await asyncio.wait(sends, timeout=60)

    async def close(self) -> None:
        self.stop.set()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=90)
        for producer in self.producers:
            with contextlib.suppress(StreamingError):
                await asyncio.wait_for(producer.close(), 30)

    def first_ack_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first ack of a message sent after it (an ack
        already on its way from a killed leader does not count)."""
        later = [acked for sent, acked in self.ack_times if sent > moment]
        return min(later) - moment if later else None

    async def wait_ack_after(self, moment: float, timeout: float) -> float:
        await wait_for(lambda: self.first_ack_after(moment) is not None, timeout, 0.05, "an ack")
        window = self.first_ack_after(moment)
        assert window is not None
        return window


class Reader:
    """A routed consumer reading from the start throughout the run."""

    def __init__(self, wal: WAL, pchannel: str) -> None:
        self.consumer = RoutedConsumer(wal.router, pchannel, DeliverPolicy.all())
        self.seen: list[tuple[int, bytes]] = []
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.consumer.open()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.next_batch()
            if batch is None:
                return
            self.seen.extend((m.offset, m.payload) for m in batch if m.payload)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StreamingError):
                await self.task
        with contextlib.suppress(StreamingError):
            await self.consumer.close()


async def describe(cluster: LocalCluster, name: str):
    return (await cluster.describe())[name]


async def wait_healthy(cluster: LocalCluster, name: str, timeout: float = 30.0) -> None:
    try:
        await wait_for(lambda: cluster.replicas_healthy(name), timeout, 0.1, "3 healthy replicas")
    except TimeoutError:
        d = await describe(cluster, name)
        raise AssertionError(
            f"not healthy after {timeout}s: {d}\n{cluster.coord_log_tail()}"
        ) from None


async def pause_old_leader(cluster: LocalCluster, name: str, work: Workload) -> dict:
    """SIGSTOP the leader, wait for a new term elsewhere, resume it: it must neither accept
    a produce at its old term nor expose anything a consumer of the final log would miss."""
    before = await describe(cluster, name)
    old, term = before.meta.node.server_id, before.meta.channel.term
    node = cluster.nodes[old]
    node.pause()
    paused_at = time.monotonic()
    try:

        async def moved() -> bool:
            d = await describe(cluster, name)
            return d.meta.state == 3 and d.meta.channel.term > term and d.meta.node.server_id != old

        await wait_for(moved, 30, 0.1, "a new leader while the old one is paused")
    finally:
        node.resume()
    resumed_at = time.monotonic()
    result: dict = {"node": old, "old_term": term, "paused_s": round(resumed_at - paused_at, 2)}
    seen: list[tuple[int, bytes]] = []
    async with NodeClient(node.address) as nc:

        async def produce() -> str:
            producer = await nc.producer(name, term, producer_id="zombie")
            try:
                r = await producer.send(b"zombie:0")
                return f"accepted at offset {r.offset}"
            finally:
                with contextlib.suppress(StreamingError):
                    await producer.abandon()

        async def consume() -> None:
            consumer = await nc.consumer(name, term, DeliverPolicy.all())
            try:
                while True:
                    batch = await consumer.next_batch()
                    if batch is None:
                        return
                    seen.extend((m.offset, m.payload) for m in batch if m.payload)
            finally:
                await consumer.close()

        outcomes = await asyncio.gather(
            asyncio.wait_for(produce(), 3.0), asyncio.wait_for(consume(), 3.0),
            return_exceptions=True,
        )  # fmt: skip
    result["produce"] = repr(outcomes[0])
    result["exposed"] = seen
    assert not (isinstance(outcomes[0], str) and outcomes[0].startswith("accepted")), result
    result["window_s"] = round(await work.wait_ack_after(paused_at, 60), 3)
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_quorum_acknowledged_messages_survive_kills_and_a_paused_leader(tmp_path) -> None:
    rng = random.Random(SEED)
    cluster = LocalCluster(tmp_path, nodes=3, probe_interval=PROBE, grace=GRACE)
    wal: WAL | None = None
    work: Workload | None = None
    reader: Reader | None = None
    started = time.monotonic()
    windows: list[tuple[str, float]] = []
    try:
        await cluster.start()
        (name,) = await cluster.create_channels(1, prefix="repl", replicas=3)
        wal = await open_wal(cluster.coord_address, failover_timeout=45)
        await wal.resolve(name, timeout=30)
        await wait_healthy(cluster, name)
        work = Workload(wal, name)
        await work.start()
        reader = Reader(wal, name)
        await reader.start()
        await work.wait_ack_after(time.monotonic(), 20)

        for k in range(KILLS):
            d = await describe(cluster, name)
            leader = d.meta.node.server_id
            followers = [m.server_id for m in d.members if m.server_id != leader]
            victim = leader if rng.random() < 2 / 3 else rng.choice(followers)
            role = "leader" if victim == leader else "follower"
            cluster.kill_node(victim)
            killed_at = time.monotonic()
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            await cluster.start_node(victim)
            window = await work.wait_ack_after(killed_at, 60)
            windows.append((role, window))
            print(f"kill {k + 1}: node {victim} ({role}), first quorum ack after {window:.2f}s")
            await wait_healthy(cluster, name)

        paused = await pause_old_leader(cluster, name, work)
        print(f"paused leader: { ({k: v for k, v in paused.items() if k != 'exposed'}) }")
        await wait_healthy(cluster, name)
        await asyncio.sleep(0.5)
        await work.close()
        await reader.close()
        assert work.acked, "nothing was acknowledged"

        # Quiesced: wait until every replica holds the same log end, then read them all.
        final = await describe(cluster, name)
        members = {m.server_id: m.address for m in final.members}

        logs = await read_replicas(members, name)
        verdict = check(logs, work.acked, [*reader.seen, *paused["exposed"]])
        leader_windows = [w for role, w in windows if role == "leader"]
        print(
            f"seed {SEED}: {len(windows)} kills ({len(leader_windows)} of the leader) + 1 pause "
            f"in {time.monotonic() - started:.0f}s; {verdict.summary()}; "
            f"{work.failed} sends failed"
        )
        all_windows = [w for _, w in windows] + [paused["window_s"]]
        print(
            "unavailability (kill -> first quorum ack): "
            f"leader kills median {statistics.median(leader_windows):.2f}s "
            f"max {max(leader_windows):.2f}s; all faults median "
            f"{statistics.median(all_windows):.2f}s max {max(all_windows):.2f}s"
        )
        reasons = Counter(
            e.get("reason") for e in cluster.coord_events("pchannel assigned", "failover done")
        )
        print(f"coord term changes by reason: {dict(reasons)}")
        assert verdict.ok, verdict.summary()
        assert len(windows) >= 20 or KILLS < 20
    finally:
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.close()
        if work is not None:
            work.stop.set()
            for t in work.tasks:
                t.cancel()
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
        await cluster.close()
