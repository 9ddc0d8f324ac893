"""One pchannel served by this node: its fence, offsets, clock, and the waiters on new data.

Offsets and ticks are handed out when an append is accepted (so concurrent producers are
ordered by arrival); they become visible to consumers only when the group commit that
holds them is durable (`committed_next`). Every record for a pchannel is written by the
single group committer in offset order, so `committed_next` only moves forward.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from streamwal.node.clock import HybridClock
from streamwal.node.fencing import Fence
from streamwal.node.log_store import ChannelMeta, Tail
from streamwal.node.producers import ProducerState

# Recently committed records kept in memory so tailing consumers skip RocksDB.
TAIL_CACHE_BYTES = 16 * 1024 * 1024


class Channel:
    def __init__(self, name: str, meta: ChannelMeta, tail: Tail) -> None:
        self.name = name
        self.meta = meta
        self.recovering = meta.serving  # a reopened pchannel waits for its Assign
        self.clock = HybridClock()
        self.clock.observe(tail.last_tick)
        self.first_offset = tail.first_offset
        self.next_offset = tail.next_offset  # next offset to hand out
        self.committed_next = tail.next_offset  # everything below is durable and visible
        self.size_bytes = tail.size_bytes  # retained bytes, counting accepted appends
        self.last_term = tail.last_term  # term of the newest record
        self.last_append_ms = 0.0
        self.producers = 0
        self.consumers = 0
        self.consumer_positions: dict[int, int] = {}
        # idempotent producers: id -> state, and batches accepted but not yet durable
        self.producer_states: dict[str, ProducerState] = {}
        self.inflight: dict[tuple[str, int], asyncio.Future] = {}
        self._changed = asyncio.Event()
        self._tail: deque[tuple[int, bytes]] = deque()
        self._tail_bytes = 0

    @property
    def fence(self) -> Fence:
        return Fence(self.meta.term, self.meta.serving, self.recovering)

    @property
    def term(self) -> int:
        return self.meta.term

    def committed(self, base: int, count: int, value: bytes) -> None:
        self.committed_next = base + count
        self._tail.append((base, value))
        self._tail_bytes += len(value)
        while self._tail_bytes > TAIL_CACHE_BYTES and len(self._tail) > 1:
            self._tail_bytes -= len(self._tail.popleft()[1])

    def notify(self) -> None:
        """Wake every consumer waiting for data or for a fence change."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float | None = None) -> None:
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def cached_from(self, offset: int, limit: int) -> list[tuple[int, bytes]] | None:
        """Committed records from the one holding `offset`, if the cache reaches back that far."""
        cache = self._tail
        if not cache or cache[0][0] > offset:
            return None
        out = []
        # Walk backwards to the first record that may hold `offset`; tails are short.
        idx = len(cache) - 1
        while idx > 0 and cache[idx][0] > offset:
            idx -= 1
        for i in range(idx, len(cache)):
            out.append(cache[i])
            if len(out) >= limit:
                break
        return out

    def rewind_uncommitted(self) -> None:
        """After a failed write: forget offsets handed out but never made durable."""
        self.next_offset = self.committed_next

    def drop_cache_after(self, offset: int) -> None:
        while self._tail and self._tail[-1][0] >= offset:
            self._tail_bytes -= len(self._tail.pop()[1])

    def drop_cache_before(self, offset: int) -> None:
        while self._tail and self._tail[0][0] < offset:
            self._tail_bytes -= len(self._tail.popleft()[1])
