"""The shape most nemesis tests share: a 3-replica pchannel under load, one fault against
its leader, the measured unavailability, healing, and the history check.

`LoadedCluster` starts the cluster, the producers and a reader; `leader_fault` injects a
fault into the leader, measures the window (fault -> first ack of a message sent after
it), heals, waits for the replicas, and returns what the test asserts on. The promise
checked (issue 22): writes flow again within the coord's grace + 1 s, and nothing
acknowledged is lost, duplicated or acknowledged twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from streamwal.client.wal import WAL, open_wal
from streamwal.testing.history import Verdict, acked_twice
from tests.nemesis.cluster import LeaderWatch, NemesisCluster
from tests.nemesis.history import Producers, Reader, read_from_start
from tests.support import wait_for

GRACE = 1.0  # the coord's: a node silent this long is lost
PROBE = 0.2
RECOVERY = GRACE + 1.0  # issue 22: writes flow again within grace + 1 s
MEASURE = 10.0  # how long a fault is held at most while writes are stopped


@dataclass
class Outcome:
    """What a fault did: how long writes stopped, who led, and the history's verdict."""

    fault: str
    victim: int
    gap: float | None = None  # the longest time without an ack from the fault to its end
    first_ack: float | None = None  # fault -> first ack of a message sent after it
    leaders: list[tuple[int, int]] = field(default_factory=list)  # (node, term) after it
    verdict: Verdict | None = None
    twice: list[str] = field(default_factory=list)
    read: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def s(value: float | None) -> str:
            return "none" if value is None else f"{value:.2f}s"

        return (
            f"{self.fault} of node {self.victim}: writes stopped for {s(self.gap)} at most "
            f"(promise {RECOVERY:.1f}s), first ack after {s(self.first_ack)}; new leaders "
            f"(node, term) {self.leaders}; {'; '.join(self.notes)}; "
            f"{self.verdict.summary() if self.verdict else 'not checked'}"
        )


class LoadedCluster:
    """A started cluster with one 3-replica pchannel, producers and a reader on it."""

    def __init__(self, cluster: NemesisCluster) -> None:
        self.cluster = cluster
        self.name = ""
        self.wal: WAL | None = None
        self.producers: Producers | None = None
        self.reader: Reader | None = None
        self.watch: LeaderWatch | None = None

    async def start(self, replicas: int = 3, failover_timeout: float = 30.0) -> LoadedCluster:
        await self.cluster.start()
        (self.name,) = await self.cluster.create_channels(1, prefix="nem", replicas=replicas)
        self.wal = await open_wal(self.cluster.coord_address, failover_timeout=failover_timeout)
        await self.wal.resolve(self.name, timeout=30)
        await self.cluster.wait_healthy([self.name])
        self.watch = LeaderWatch(self.cluster, [self.name]).start()
        self.producers = Producers(self.wal, self.name).start()
        self.reader = Reader(self.wal, self.name).start()
        await self.producers.wait_acks(100, timeout=30)
        return self

    async def leader(self) -> int:
        leader = await self.cluster.leader(self.name)
        assert leader is not None, f"{self.name} has no leader"
        return leader

    async def fault(
        self,
        fault: str,
        victim: int,
        inject: Callable[[], Awaitable[None] | None],
        heal: Callable[[], Awaitable[None] | None],
        hold: float = 0.0,
        patience: float = MEASURE,
    ) -> Outcome:
        """Inject; keep the fault `hold` seconds, and longer while writes are stopped
        (until they resume, at most `patience` seconds in all); heal; wait until the
        replicas are healthy again. The outcome's gap is the longest time without an ack
        from the fault to that end."""
        assert self.producers is not None and self.watch is not None
        producers = self.producers
        await _call(inject)
        injected = time.monotonic()
        try:
            await asyncio.sleep(hold)
            stopped = lambda: time.monotonic() - producers.last_ack() > RECOVERY  # noqa: E731
            if stopped():
                with contextlib.suppress(TimeoutError):
                    await wait_for(lambda: not stopped(), injected + patience - time.monotonic())
            ended = time.monotonic()
        finally:
            await _call(heal)
        await self.cluster.wait_healthy([self.name], timeout=60)
        return Outcome(
            fault,
            victim,
            gap=producers.longest_gap(injected, ended),
            first_ack=producers.first_ack_after(injected),
            leaders=[(node, term) for t, _, node, term in self.watch.seen if t >= injected],
        )

    async def finish(self, outcome: Outcome | None = None) -> Outcome:
        """Stop the load, read from the start, check every replica; fills `outcome`."""
        assert self.producers is not None and self.reader is not None and self.wal is not None
        outcome = outcome or Outcome("none", 0)
        await self.producers.stop()
        await self.reader.stop()
        await self.cluster.wait_healthy([self.name], timeout=60)
        outcome.read = len(await read_from_start(self.wal, self.name))
        acked = self.producers.acked
        outcome.twice = acked_twice(acked)
        outcome.verdict = await self.cluster.check(self.name, acked, self.reader.seen)
        return outcome

    async def close(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        for part in (self.producers, self.reader):
            if part is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(part.stop(), 30)
        if self.wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.wal.close(), 10)


async def _call(fn: Callable[[], Awaitable[None] | None]) -> None:
    result = fn()
    if asyncio.iscoroutine(result):
        await result


def assert_promise(outcome: Outcome) -> None:
    """Writes stop for at most grace + 1 s; nothing acknowledged lost, duplicated or
    acknowledged twice; replicas agree. Every broken promise is named at once."""
    print(outcome.summary())
    problems = []
    if outcome.gap is not None and outcome.gap > RECOVERY:
        problems.append(f"writes stopped for {outcome.gap:.2f}s, the promise is {RECOVERY}s")
    if outcome.verdict is None or not outcome.verdict.ok:
        problems.append("the history check failed")
    if outcome.twice:
        problems.append(f"offsets acknowledged twice: {outcome.twice[:5]}")
    assert not problems, f"{outcome.fault}: {'; '.join(problems)}\n{outcome.summary()}"
