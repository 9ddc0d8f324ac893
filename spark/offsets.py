"""Offset arithmetic of the data source, without I/O: ranges, data loss, limits, splits.

A Spark offset of this source is a dict {pchannel: next offset to read}; a micro-batch
reads [start[p], end[p]) of every pchannel p. Offsets are MessageIDs (dense per
pchannel, never reused), so the checkpointed dict is exactly where a restarted query
resumes. `Bounds` is what a node reports of a pchannel: the oldest retained offset and
the offset the next appended message gets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamwal.errors import InvalidArgument, StreamingError
from streamwal.spark.options import EARLIEST, LATEST, OffsetSpec


class DataLoss(StreamingError):
    """Offsets a query needs were removed (retention) or never existed (log reset)."""


@dataclass(frozen=True)
class Bounds:
    first: int  # oldest retained offset
    next: int  # offset of the next message to be appended (log end)


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one pchannel; `from_earliest` ranges accept truncation
    silently (a pchannel discovered after the query started is read from its start)."""

    pchannel: str
    start: int
    end: int
    from_earliest: bool = False

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def timestamps(spec: OffsetSpec, pchannels: Iterable[str]) -> dict[str, int]:
    """{pchannel: ms} of the times a by-time spec asks about (empty for offsets)."""
    return {p: spec.value_for(p) for p in pchannels} if spec.by_time else {}


def resolve(
    spec: OffsetSpec,
    bounds: Mapping[str, Bounds],
    at_time: Mapping[str, int | None] = {},
    *,
    not_found_latest: bool = True,
) -> dict[str, int]:
    """Concrete offsets per pchannel: -2 is the oldest retained, -1 the log end.

    For a by-time spec `at_time` holds, per pchannel, the first offset whose time tick is
    at or after the asked time, or None when there is none yet: then the log end if
    `not_found_latest` (always so for an end, as Kafka), else an InvalidArgument.
    """
    out = {}
    for name, b in bounds.items():
        wanted = spec.value_for(name)
        if spec.by_time:
            found = at_time[name]
            if found is None and not not_found_latest:
                raise InvalidArgument(
                    f"{spec.option}: pchannel {name} has no message at or after {wanted} ms "
                    f"(it ends at offset {b.next}). Set startingOffsetsByTimestampStrategy="
                    f"latest to start such a pchannel at its end."
                )
            out[name] = b.next if found is None else found
        else:
            out[name] = b.first if wanted == EARLIEST else b.next if wanted == LATEST else wanted
    return out


def loss_message(pchannel: str, start: int, first: int, end: int) -> str:
    lost_to = min(first, end)
    return (
        f"pchannel {pchannel}: offsets [{start}, {lost_to}) are no longer available "
        f"(oldest retained offset is {first}); they were removed by retention before this "
        f"query read them. Set failOnDataLoss=false to skip them."
    )


def effective_start(r: Range, first: int, log_end: int, fail_on_data_loss: bool) -> int:
    """Where reading `r` really starts given the node's retained [first, log_end).

    Raises DataLoss when part of the range is gone and the query asked to fail; a
    start beyond the log end (the log was reset under the checkpoint) is loss too.
    """
    if r.start > log_end:
        if fail_on_data_loss and not r.from_earliest:
            raise DataLoss(
                f"pchannel {r.pchannel}: the query wants offset {r.start} but the log ends at "
                f"{log_end}: the pchannel was recreated or its log reset. Set "
                f"failOnDataLoss=false to read it from its earliest offset."
            )
        return first
    if r.start < first:
        if fail_on_data_loss and not r.from_earliest:
            raise DataLoss(loss_message(r.pchannel, r.start, first, r.end))
        return first
    return r.start


def ranges(start: Mapping[str, int], end: Mapping[str, int]) -> list[Range]:
    """The ranges of a micro-batch; a pchannel new in `end` is read from its earliest."""
    out = []
    for name in sorted(end):
        if name in start:
            out.append(Range(name, start[name], end[name]))
        else:
            out.append(Range(name, 0, end[name], from_earliest=True))
    return [r for r in out if r.size > 0]


def rate_limit(
    start: Mapping[str, int], latest: Mapping[str, int], limit: int | None
) -> dict[str, int]:
    """End offsets that read at most `limit` offsets in total (maxOffsetsPerTrigger).

    As Kafka's source, the budget is shared in proportion to each pchannel's backlog
    (largest remainders get the leftover), so a busy pchannel cannot starve the others.
    """
    backlog = {p: max(0, latest[p] - start.get(p, latest[p])) for p in latest}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return dict(latest)
    shares = {p: limit * n / total for p, n in backlog.items()}
    taken = {p: math.floor(s) for p, s in shares.items()}
    leftover = limit - sum(taken.values())
    for p in sorted(shares, key=lambda p: (taken[p] - shares[p], p))[:leftover]:
        taken[p] += 1
    return {p: start.get(p, latest[p]) + min(taken[p], backlog[p]) for p in latest}


def delay_trigger(
    start: Mapping[str, int],
    latest: Mapping[str, int],
    min_offsets: int | None,
    since_last_s: float | None,
    max_delay_s: float,
) -> bool:
    """Hold a micro-batch back (Kafka's minOffsetsPerTrigger / maxTriggerDelay): fewer
    than `min_offsets` new offsets, and less than `max_delay_s` since the last micro-batch
    (`since_last_s`; None before the first, which is never held)."""
    if min_offsets is None or since_last_s is None or since_last_s >= max_delay_s:
        return False
    new = sum(max(0, o - start[p]) for p, o in latest.items() if p in start)
    return new < min_offsets


def cap(latest: Mapping[str, int], target: Mapping[str, int]) -> dict[str, int]:
    """`latest` never beyond `target` (Trigger.AvailableNow); pchannels not in target stay."""
    return {p: min(o, target[p]) if p in target else o for p, o in latest.items()}


def split(rs: Iterable[Range], max_per_partition: int, min_partitions: int | None) -> list[Range]:
    """Cut ranges into pieces of at most `max_per_partition` offsets, and into at least
    `min_partitions` pieces overall (Kafka's minPartitions), for parallel reads."""
    rs = list(rs)
    total = sum(r.size for r in rs)
    size = max_per_partition
    if min_partitions and total:
        size = max(1, min(size, math.ceil(total / min_partitions)))
    out = []
    for r in rs:
        pieces = max(1, math.ceil(r.size / size))
        step = math.ceil(r.size / pieces)
        for i in range(pieces):
            lo = r.start + i * step
            hi = min(r.end, lo + step)
            if hi > lo:
                out.append(Range(r.pchannel, lo, hi, r.from_earliest))
    return out
