"""What the nemesis tests run against a cluster and record: producers, a reader, a final
read from the start (all checked with streamwal.testing.history).

Producers send ``b"<producer>:<index>"`` payloads (indices grow; `history.payload`) with
a window of sends in flight, through the routed client as an application would. A send
that fails is not retried (its payload may or may not be in the log, at most once); a
producer that broke for good is replaced by a new one, so writes resume whenever the
cluster lets them. Every acknowledgement is kept with its send and ack times, which give
the unavailability window of a fault: from the fault to the first ack of a message sent
after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field

from streamwal.client.policy import DeliverPolicy
from streamwal.client.routing import RoutedConsumer, RoutedProducer
from streamwal.client.wal import WAL
from streamwal.errors import StreamingError
from streamwal.testing.history import Acked, payload
from tests.node.helpers import read_through
from tests.support import wait_for


@dataclass
class Producers:
    """`count` producers appending to `pchannel` until `stop()`."""

    wal: WAL
    pchannel: str
    count: int = 2
    window: int = 8
    name: str = "p"
    acked: list[Acked] = field(default_factory=list)
    ack_times: list[tuple[float, float]] = field(default_factory=list)  # (sent, acked)
    failed: int = 0
    reopened: int = 0
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> Producers:
        self._tasks = [asyncio.create_task(self._run(f"{self.name}{i}")) for i in range(self.count)]
        return self

    async def _run(self, name: str) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                producer = await self.wal.producer(self.pchannel, producer_id=f"nemesis-{name}")
            except StreamingError as exc:
                self._error(exc)
                await asyncio.sleep(0.2)
                continue
            try:
                index = await self._send_until_broken(name, producer, index)
            finally:
                with contextlib.suppress(StreamingError, TimeoutError):
                    await asyncio.wait_for(producer.close(), 5)
            self.reopened += 1

    async def _send_until_broken(self, name: str, producer: RoutedProducer, index: int) -> int:
        """`window` senders, each one send at a time, numbering from `index` (a send
        enqueues before it first waits, so the numbers reach the log in order) until one
        fails or the producers stop; returns the next free number."""
        numbers = itertools.count(index)
        broken = asyncio.Event()

        async def sender() -> None:
            while not self._stop.is_set() and not broken.is_set():
                i, sent = next(numbers), time.monotonic()
                try:
                    result = await producer.send(payload(name, i))
                except StreamingError as exc:
                    self._error(exc)
                    broken.set()
                    return
                self.acked.append(Acked(name, i, result.offset))
                self.ack_times.append((sent, time.monotonic()))

        senders = [asyncio.create_task(sender()) for _ in range(self.window)]
        try:
            await asyncio.wait(senders, timeout=None)
        finally:
            for task in senders:
                task.cancel()
        return next(numbers)

    def _error(self, exc: StreamingError) -> None:
        self.failed += 1
        self.errors[type(exc).__name__] += 1

    async def stop(self, timeout: float = 90.0) -> None:
        """Stop sending; sends in flight get `timeout` seconds to be answered (after a
        crash they would only wait out the client's failover timeout)."""
        self._stop.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def acks_since(self, moment: float) -> int:
        return sum(1 for sent, _ in self.ack_times if sent > moment)

    def first_ack_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first ack of a message sent after it (an ack
        already on its way before the fault does not count)."""
        later = [acked for sent, acked in self.ack_times if sent > moment]
        return min(later) - moment if later else None

    def last_ack(self) -> float:
        return max((acked for _, acked in self.ack_times), default=0.0)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time within [start, end] without an acknowledgement: how long the
        producers could not write (an ack that slipped through before the stall, e.g.
        into a preallocated file, does not hide it)."""
        points = sorted(acked for _, acked in self.ack_times if start < acked < end)
        edges = [start, *points, end]
        return max(b - a for a, b in itertools.pairwise(edges))

    async def wait_ack_after(self, moment: float, timeout: float) -> float | None:
        """The window after `moment` (None if no ack came within `timeout`)."""
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: self.first_ack_after(moment) is not None, timeout, 0.05)
        return self.first_ack_after(moment)

    async def wait_acks(self, count: int, timeout: float = 30.0) -> None:
        target = len(self.acked) + count
        await wait_for(lambda: len(self.acked) >= target, timeout, 0.05, f"{count} more acks")


class Reader:
    """A routed consumer reading `pchannel` from the start for the whole run."""

    def __init__(self, wal: WAL, pchannel: str) -> None:
        self.wal = wal
        self.pchannel = pchannel
        self.seen: list[tuple[int, bytes]] = []
        self.errors: list[str] = []
        self._task: asyncio.Task | None = None

    def start(self) -> Reader:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            last = self.seen[-1][0] if self.seen else None
            policy = DeliverPolicy.all() if last is None else DeliverPolicy.start_after(last)
            consumer = RoutedConsumer(self.wal.router, self.pchannel, policy)
            try:
                await consumer.open()
                while (batch := await consumer.next_batch()) is not None:
                    self.seen.extend((m.offset, m.payload) for m in batch if m.payload)
            except StreamingError as exc:
                self.errors.append(repr(exc))
                await asyncio.sleep(0.2)
            finally:
                with contextlib.suppress(StreamingError):
                    await consumer.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StreamingError):
                await self._task


async def read_from_start(
    wal: WAL, pchannel: str, timeout: float = 30.0
) -> list[tuple[int, bytes]]:
    """Every message (offset, payload) of `pchannel` up to its end now, read through its
    current owner; AssertionError if the read stalls (`timeout`) or ends early."""
    end = await asyncio.wait_for(wal.end_offset(pchannel), timeout)
    if not end:
        return []
    consumer = await asyncio.wait_for(
        wal.consumer(pchannel, DeliverPolicy.all(), time_ticks=True, end_offset=end), timeout
    )
    try:
        messages = await read_through(consumer, end - 1, timeout)
    finally:
        await consumer.close()
    return [(m.offset, m.payload) for m in messages if m.payload]


def lost(acked: list[Acked], log: dict[int, bytes]) -> list[Acked]:
    """Acknowledged messages that are not at their offset in `log` (offset -> payload)."""
    return [a for a in acked if log.get(a.offset) != a.payload]
