"""What a consumer gets: where it starts (DeliverPolicy) and which messages pass (filters).

Pure functions over records, so every policy and filter is tested without a server.
Time-tick filters cut a record by index (ticks grow by one per message inside a record);
the vchannel filter must look at each message, and keeps TimeTick messages so that a
vchannel consumer still sees time progress on its pchannel.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from streamwal.errors import InvalidArgument
from streamwal.ids import decode_offset, encode_offset
from streamwal.message import PROP_TERM, PROP_TIME_TICK, PROP_TYPE, PROP_VCHANNEL, MsgType
from streamwal.node import records
from streamwal.node.records import Record
from streamwal.proto import streaming_pb2 as pb

_TIME_TICK = str(int(MsgType.TimeTick))


@dataclass(frozen=True)
class Filters:
    min_tick: int = 0  # deliver ticks >= min_tick
    vchannel: str | None = None

    @staticmethod
    def from_proto(filters: list[pb.DeliverFilter]) -> Filters:
        min_tick, vchannel = 0, None
        for f in filters:
            kind = f.WhichOneof("filter")
            if kind == "time_tick_gt":
                min_tick = max(min_tick, f.time_tick_gt.time_tick + 1)
            elif kind == "time_tick_gte":
                min_tick = max(min_tick, f.time_tick_gte.time_tick)
            elif kind == "vchannel":
                if vchannel is not None and vchannel != f.vchannel.vchannel:
                    raise InvalidArgument("at most one vchannel filter per consumer")
                vchannel = f.vchannel.vchannel
            else:
                raise InvalidArgument("empty DeliverFilter")
        return Filters(min_tick, vchannel)


def start_offset(policy: pb.DeliverPolicy, first_offset: int, next_offset: int) -> int:
    """The first offset to deliver; below `first_offset` (retention) it is clamped."""
    kind = policy.WhichOneof("policy")
    if kind is None or kind == "all":
        return first_offset
    if kind == "latest":
        return max(first_offset, next_offset - 1)
    raw = policy.start_from.id if kind == "start_from" else policy.start_after.id
    try:
        offset = decode_offset(raw)
    except ValueError as exc:
        raise InvalidArgument(f"bad MessageID in deliver policy: {exc}") from None
    if kind == "start_after":
        offset += 1
    if offset > next_offset:
        raise InvalidArgument(
            f"deliver policy {kind} offset {offset} is past the end of the log ({next_offset})"
        )
    return max(offset, first_offset)


@dataclass(frozen=True, slots=True)
class Slice:
    """Messages a consumer gets, from one record or several joined ones."""

    first_offset: int
    first_tick: int
    body: bytes  # serialized MessageBatch
    count: int
    offsets: list[int] | None = None  # None: dense from first_offset
    ticks: list[int] | None = None  # with offsets: each message's tick
    # Dense slices only: (messages, first tick) per run of ticks growing by one;
    # None means one run of `count` from first_tick.
    tick_runs: list[tuple[int, int]] | None = None

    def runs(self) -> list[tuple[int, int]]:
        return self.tick_runs or [(self.count, self.first_tick)]


def select(
    base: int, rec: Record, from_offset: int, filters: Filters, end_offset: int | None = None
) -> Slice | None:
    """The part of a record (base offset `base`) in [from_offset, end_offset) passing filters.

    Internal records (cursor snapshots) are never delivered. A txn's messages share one
    tick, so a tick filter takes all of them or none.
    """
    if rec.internal:
        return None
    shared = bool(rec.flags & records.FLAG_SHARED_TICK)
    below_tick = filters.min_tick - rec.first_tick
    if shared and below_tick > 0:
        below_tick = rec.count
    skip = max(from_offset - base, below_tick, 0)
    stop = rec.count if end_offset is None else min(rec.count, end_offset - base)
    if skip >= stop:
        return None
    if filters.vchannel is None:
        body, count = rec.body, stop - skip
        if skip or stop < rec.count:
            batch = pb.MessageBatch.FromString(rec.body)
            del batch.messages[stop:]
            del batch.messages[:skip]
            body = batch.SerializeToString()
        if shared:  # one run per message, all at the commit's tick
            return Slice(
                base + skip, rec.first_tick, body, count, tick_runs=[(1, rec.first_tick)] * count
            )
        return Slice(base + skip, rec.first_tick + skip, body, count)
    batch = pb.MessageBatch.FromString(rec.body)
    keep = pb.MessageBatch()
    offsets: list[int] = []
    ticks: list[int] = []
    for i in range(skip, stop):
        msg = batch.messages[i]
        props = msg.properties
        if props.get(PROP_VCHANNEL) == filters.vchannel or props.get(PROP_TYPE) == _TIME_TICK:
            keep.messages.append(msg)
            offsets.append(base + i)
            ticks.append(rec.tick_of(i))
    if not offsets:
        return None
    return Slice(offsets[0], ticks[0], keep.SerializeToString(), len(offsets), offsets, ticks)


JOIN_BYTES = 256 * 1024  # records smaller than this share frames


def joinable(pieces: list[Slice], piece: Slice) -> bool:
    """Whether `piece` may join `pieces` in one frame (bounded size)."""
    return sum(len(p.body) for p in pieces) + len(piece.body) < JOIN_BYTES


def join(pieces: list[Slice]) -> Slice:
    """Consecutive slices as one: their MessageBatch bodies concatenate (repeated fields
    merge on the wire). A log written one message at a time then costs one frame per
    256 KiB, not one per message. Unfiltered slices stay dense (offsets implied, ticks as
    one run per record), so neither side handles a number per message."""
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    body = b"".join(p.body for p in pieces)
    count = sum(p.count for p in pieces)
    dense = all(p.offsets is None for p in pieces) and all(
        b.first_offset == a.first_offset + a.count for a, b in pairwise(pieces)
    )
    if dense:
        runs = [run for p in pieces for run in p.runs()]
        return Slice(first.first_offset, first.first_tick, body, count, tick_runs=runs)
    offsets: list[int] = []
    ticks: list[int] = []
    for p in pieces:
        if p.offsets is not None:
            offsets += p.offsets
            ticks += p.ticks or []
        else:
            offsets += range(p.first_offset, p.first_offset + p.count)
            for n, tick in p.runs():
                ticks += range(tick, tick + n)
    return Slice(offsets[0], ticks[0], body, count, offsets, ticks)


def batch_frame(s: Slice, term: int) -> pb.ConsumeResponse:
    return pb.ConsumeResponse(
        consume_batch=pb.ConsumeBatchResponse(
            first_id=pb.MessageID(id=encode_offset(s.first_offset)),
            term=term,
            first_time_tick=s.first_tick,
            messages=s.body,
            offsets=s.offsets or (),
            time_ticks=s.ticks or (),
            tick_run_counts=[n for n, _ in s.tick_runs or ()],
            tick_run_first_ticks=[t for _, t in s.tick_runs or ()],
        )
    )


def message_frames(s: Slice, term: int) -> list[pb.ConsumeResponse]:
    """One seed-style ConsumeMessageReponse per message, with `_tt` and `_wt` set."""
    batch = pb.MessageBatch.FromString(s.body)
    frames = []
    wt = str(term)
    ticks = s.ticks or [t + i for n, t in s.runs() for i in range(n)]
    for i, msg in enumerate(batch.messages):
        offset = s.offsets[i] if s.offsets else s.first_offset + i
        tick = ticks[i]
        msg.properties[PROP_TIME_TICK] = str(tick)
        msg.properties[PROP_TERM] = wt
        frames.append(
            pb.ConsumeResponse(
                consume=pb.ConsumeMessageReponse(
                    id=pb.MessageID(id=encode_offset(offset)), message=msg
                )
            )
        )
    return frames
