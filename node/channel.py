"""One pchannel served by this node: its core (core.py) and the waiters on new data.

Offsets and ticks are handed out when an append is accepted (so concurrent producers are
ordered by arrival); they become visible to consumers only when the group commit that
holds them is durable (`committed_next`). Every record for a pchannel is written by the
single group committer in offset order, so `committed_next` only moves forward. A
replicated pchannel shows consumers only what is below its commit offset (`visible_next`).
The core decides all of it; this keeps what only a process has.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import operator
from collections.abc import Callable, Coroutine
from typing import Any

from streamwal.node.channel_meta import ChannelMeta, Tail
from streamwal.node.core import PChannelCore

# Recently committed records kept in memory so tailing consumers skip RocksDB.
TAIL_CACHE_BYTES = 16 * 1024 * 1024


def _core(name: str) -> Any:
    """A field the pchannel's core owns, read through the Channel (read only: only the
    core's inputs change it; a C-level getter, several are read per append)."""
    return property(operator.attrgetter(f"core.{name}"))


class Channel:
    """The driver's side of one pchannel: its core (core.py, every decision and the
    state they rest on), and what only a process has: the waiters on new data, the tail
    cache, the futures of batches in flight, the ledger slot, the verification's
    progress and the connection counts."""

    meta = _core("meta")
    first_offset = _core("first_offset")
    next_offset = _core("next_offset")
    committed_next = _core("committed_next")
    size_bytes = _core("size_bytes")
    commit = _core("commit")  # None: one replica, everything durable is committed
    damage = _core("damage")  # why the log here may lack acknowledged records ("": whole)
    fence = _core("fence")
    visible_next = _core("visible_next")  # consumers see offsets below this
    known_commit = _core("known_commit")
    term = _core("term")
    producer_states = _core("producers")  # idempotent producers' windows, least recent first

    def __init__(
        self,
        name: str,
        meta: ChannelMeta,
        tail: Tail,
        commit: int | None = None,
        node_id: int = 0,
        load_window: Callable[[str], bytes | None] = lambda _: None,
        ledger_mark: int = 0,
        known: bool = True,
    ) -> None:
        self.name = name
        self.core = PChannelCore(name, node_id, meta, tail, commit, load_window, known, ledger_mark)
        self.producers = 0
        self.consumers = 0
        self.tick_readers = 0  # consumers taking time ticks (Wal.want_ticks)
        self.consumer_positions: dict[int, int] = {}
        # Idempotent producers' batches accepted but not yet durable: their answers.
        self.inflight: dict[tuple[str, int], asyncio.Future] = {}
        self._changed = asyncio.Event()
        # Called at every notify and whenever records go to the disk: the leader's
        # replication streams (replication.py), woken without a task of their own. Each
        # returns True when it did what there was to do itself (no task of its woken).
        self.wakers: list[Callable[[], bool]] = []
        self._tail = _TailCache()
        # Corruption (Wal): the acknowledged-offset ledger's slot, and the end of what an
        # earlier process wrote and nobody has verified since this one started (0: all
        # verified).
        self.ledger_slot = -1
        self.unverified_end = 0
        # Async durability: every offset acknowledged is below this (ack_ledger.py).
        self.ceiling = 0
        self.verify_urgent = False  # someone waits for the verification: no pauses

    def cache(self, base: int, count: int, value: bytes) -> None:
        """A record of `count` messages, kept for tailing consumers and the replication
        streams; cached as it goes to the disk (readers stop at what is durable)."""
        self._tail.append(base, base + count, value)

    @property
    def cached_end(self) -> int:
        """The offset after the newest cached record (0: none yet)."""
        return self._tail.end

    def notify(self) -> None:
        """Wake every consumer waiting for data or for a fence change."""
        self._changed.set()
        self._changed = asyncio.Event()
        for wake in self.wakers:
            wake()

    def wait_changed(self, timeout: float | None = None) -> Coroutine[Any, Any, None]:
        """Waits for the next notify after this call. Not a coroutine function on purpose:
        callers wrap it in a task that first runs a loop step later, and a notify in
        between (an inline group commit) must still wake it, or a replication stream
        sleeps until the idle time tick (the 250 ms QUORUM stalls)."""
        return _wait_set(self._changed, timeout)

    def cached_from(
        self, offset: int, limit: int, max_bytes: int
    ) -> list[tuple[int, bytes]] | None:
        """Committed records from the one holding `offset`, if the cache reaches back that far."""
        return self._tail.read_from(offset, limit, max_bytes)

    def drop_cache_after(self, offset: int) -> None:
        self._tail.drop_after(offset)

    def drop_cache_before(self, offset: int) -> None:
        self._tail.drop_before(offset)


class _TailCache:
    """The newest committed records, oldest first, found by bisection on base offsets.

    A list with a moving start (compacted now and then) instead of a deque: a deque's
    indexing walks from an end, which made tailing a log of single-message records
    quadratic in the cache length.
    """

    def __init__(self, capacity: int = TAIL_CACHE_BYTES) -> None:
        self._capacity = capacity
        self._bases: list[int] = []
        self._values: list[bytes] = []
        self._start = 0
        self._bytes = 0
        self._end = 0  # the offset after the newest cached record

    @property
    def end(self) -> int:
        return self._end

    def append(self, base: int, end: int, value: bytes) -> None:
        """`value` holds offsets base..end-1. A record that does not start where the cache
        ends (a hole: a record cached out of turn) starts the cache anew: reads bisect on
        base offsets and would step over the missing records."""
        if self._start < len(self._bases) and base != self._end:
            self._bases, self._values, self._start, self._bytes = [], [], 0, 0
        self._end = end
        self._bases.append(base)
        self._values.append(value)
        self._bytes += len(value)
        while self._bytes > self._capacity and len(self._bases) - self._start > 1:
            self._bytes -= len(self._values[self._start])
            self._start += 1
        if self._start > 1024 and self._start * 2 > len(self._bases):
            del self._bases[: self._start]
            del self._values[: self._start]
            self._start = 0

    def read_from(self, offset: int, limit: int, max_bytes: int) -> list[tuple[int, bytes]] | None:
        if self._start >= len(self._bases) or self._bases[self._start] > offset:
            return None
        i = bisect.bisect_right(self._bases, offset, lo=self._start) - 1
        out: list[tuple[int, bytes]] = []
        size = 0
        for j in range(i, min(len(self._bases), i + limit)):
            out.append((self._bases[j], self._values[j]))
            size += len(self._values[j])
            if size >= max_bytes:
                break
        return out

    def drop_after(self, offset: int) -> None:
        """Forget the records from `offset` (a record boundary: the log was cut there)."""
        while len(self._bases) > self._start and self._bases[-1] >= offset:
            self._bases.pop()
            self._bytes -= len(self._values.pop())
            self._end = offset

    def drop_before(self, offset: int) -> None:
        while self._start < len(self._bases) and self._bases[self._start] < offset:
            self._bytes -= len(self._values[self._start])
            self._start += 1


async def _wait_set(event: asyncio.Event, timeout: float | None) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
