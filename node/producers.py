"""Idempotent producers: a resent batch is answered from memory, never appended twice.

A producer that names itself (`producer_id`) numbers its batches 1, 2, 3, ... per
pchannel. The node remembers, per producer, the last sequence it accepted and the
results of the last WINDOW batches, and persists that window in the same RocksDB write
as the batch itself, so the answer to a resend survives a restart exactly as far as the
batch does. Pure bookkeeping: the Wal decides when to persist.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamwal.errors import IgnoredOperation

WINDOW = 32  # results kept per producer: more than a client's batches in flight
_ENTRY = struct.Struct(">QQQI")  # sequence, base offset, first tick, count


@dataclass(frozen=True, slots=True)
class BatchResult:
    base: int
    first_tick: int
    count: int


@dataclass
class ProducerState:
    accepted: int = 0  # last sequence accepted (durable or in flight)
    results: OrderedDict[int, BatchResult] = field(default_factory=OrderedDict)
    last_used: float = 0.0  # wall-clock seconds of the last append or lookup (core's now)
    # Each result as persisted, packed once when accepted: the window is written with
    # every batch, and packing all of it each time cost ~15 us per one-message batch.
    _packed: dict[int, bytes] = field(default_factory=dict)

    def encode_upto(self, sequence: int) -> bytes:
        """The window as persisted with batch `sequence`: nothing after it, which may not
        be durable yet."""
        if sequence >= self.accepted:
            return b"".join(self._packed.values())
        return b"".join(p for seq, p in self._packed.items() if seq <= sequence)

    @property
    def end(self) -> int:
        """Where the newest remembered batch ends (0: none)."""
        return max((r.base + r.count for r in self.results.values()), default=0)

    def add(self, sequence: int, result: BatchResult) -> None:
        self.accepted = max(self.accepted, sequence)
        self.results[sequence] = result
        self._packed[sequence] = _ENTRY.pack(sequence, result.base, result.first_tick, result.count)
        while len(self.results) > WINDOW:
            oldest, _ = self.results.popitem(last=False)
            del self._packed[oldest]

    def forget(self, sequence: int) -> None:
        """Drop a batch that never became durable, so its resend is appended for real."""
        self.results.pop(sequence, None)
        self._packed.pop(sequence, None)
        self.accepted = min(self.accepted, sequence - 1)

    @staticmethod
    def decode(raw: bytes) -> ProducerState:
        state = ProducerState()
        for off in range(0, len(raw), _ENTRY.size):
            seq, base, tick, count = _ENTRY.unpack_from(raw, off)
            state.add(seq, BatchResult(base, tick, count))
        return state


def idle_producers(
    states: OrderedDict[str, ProducerState], now: float, idle_s: float, busy: set[str]
) -> list[str]:
    """Producers whose state may leave memory: unused for `idle_s`, nothing in flight.

    `states` is kept in order of use (least recent first), so the scan stops at the
    first producer used recently: the cost is the number evicted, not the number held.
    Their windows stay in RocksDB and are read again if the producer comes back.
    """
    out = []
    for producer_id, state in states.items():
        if now - state.last_used < idle_s:
            break
        if producer_id not in busy:
            out.append(producer_id)
    return out


def window_end(raw: bytes) -> int:
    """Where the newest batch of a persisted window ends (0: an empty window)."""
    return max((base + count for _, base, _, count in _ENTRY.iter_unpack(raw)), default=0)


def cut_producers(
    window_ends: Iterable[tuple[str, int]],
    keep_from: int,
    held: Mapping[str, ProducerState],
    busy: set[str],
) -> list[str]:
    """Producers to forget when retention cuts the log below `keep_from`: every batch
    their window remembers is gone (`window_ends`: producer id, `window_end` of its
    persisted window), and none is in flight or newer in memory.

    Kafka keeps a producer's state while any of its batches is in the log, for the same
    reason: a producer that resends a batch retention already removed is long gone.
    Without this, a producer id per Spark task left a window on disk for good.
    """
    out = []
    for producer_id, end in window_ends:
        state = held.get(producer_id)
        if producer_id in busy or (state is not None and state.end > keep_from):
            continue
        if end <= keep_from:
            out.append(producer_id)
    return out


def window_below(raw: bytes, offset: int) -> bytes:
    """A persisted window without the batches at or past `offset` (a log cut there)."""
    return b"".join(
        raw[i : i + _ENTRY.size]
        for i in range(0, len(raw), _ENTRY.size)
        if _ENTRY.unpack_from(raw, i)[1] < offset
    )


class Duplicate(Exception):
    """The batch was accepted before; `result` is what it got."""

    def __init__(self, result: BatchResult) -> None:
        super().__init__(f"duplicate of a batch appended at offset {result.base}")
        self.result = result


def check_sequence(state: ProducerState | None, sequence: int, producer_id: str) -> None:
    """Raises Duplicate (answer from memory) or IgnoredOperation (appended, too old to
    answer); returns when the batch must be appended.

    Gaps are allowed: a batch the node rejected (too large, malformed) used up its
    sequence number without being appended, and a producer's state may live on another
    node. Order within a producer is kept by its single stream.
    """
    if state is None or sequence > state.accepted:
        return
    known = state.results.get(sequence)
    if known is not None:
        raise Duplicate(known)
    raise IgnoredOperation(
        f"producer {producer_id!r} batch {sequence} was appended long ago "
        f"(last {state.accepted}); its result is no longer kept"
    )
