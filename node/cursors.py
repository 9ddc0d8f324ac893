"""Consumer-group cursors of one pchannel (seed 001's RocksMQ groups), without I/O.

A cursor is the next offset its group gets. The whole table is small (at most
MAX_GROUPS names), so every change is persisted as a full snapshot in one internal log
record (records.FLAG_CURSORS): replaying a pchannel's cursors means decoding its newest
snapshot, never scanning the log, and whatever copies the log (catch-up, replication)
copies the cursors with it. `take` decides what a consume gets and where the cursor goes.

A consume moves the cursor before its answer travels; were that answer lost (a broken
call, an owner killed right after persisting), its messages would be lost to the group.
So a consumer may name itself and number its calls (a claim): the table keeps, per
consumer, the last claim and the range it got, in the same snapshot as the cursor, and
a retry of that claim gets the same range again instead of the next one.

At-least-once (issue 18): a consume may also leave its range *pending* on the consumer
until the consumer commits it. A consumer not heard from within its session timeout is
gone: its pending ranges become *orphans*, handed to the next consumes of the group
before anything new (redelivery). The group's committed offset is the lowest offset
still pending or orphaned (else the cursor): everything below it was processed. Pending
ranges and orphans are in the snapshot (a move or a restart keeps them); when each
consumer was last heard from is not (after a load every consumer gets a fresh session).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamwal.errors import ConsumerGroupExist, ConsumerGroupNotExist, InvalidArgument
from streamwal.node import delivery, records
from streamwal.node.records import CorruptRecord, Record

MAX_GROUPS = 1024  # per pchannel: a snapshot stays a few tens of KiB at most
MAX_NAME_BYTES = 200
MAX_CLAIMS = 64  # per group: the consumers that called last; older claims are forgotten
_VERSION_CURSORS = 1  # cursors only (still read)
_VERSION_CLAIMS = 2  # cursors, then each group's claims (still read)
_VERSION = 3  # cursors, claims, then pending ranges (consumer "" holds the orphans)
MAX_PENDING = 256  # uncommitted ranges per consumer: it must commit to take more
DEFAULT_SESSION_S = 10.0  # a consumer silent this long is gone (its ranges redelivered)
_NAME_LEN = struct.Struct(">H")
_CURSOR = struct.Struct(">Q")
_CLAIM = struct.Struct(">QQQ")  # claim, first offset, end offset
_RANGE = struct.Struct(">QQ")  # first offset, end offset
_ORPHANS = ""  # the pending "consumer" whose ranges are a gone consumer's, to redeliver
_NO_FILTERS = delivery.Filters()


def validate_group(name: str) -> None:
    raw = name.encode()
    if not raw or len(raw) > MAX_NAME_BYTES or not name.isprintable():
        raise InvalidArgument(
            f"invalid consumer group name {name!r}: 1..{MAX_NAME_BYTES} printable bytes"
        )


@dataclass(frozen=True)
class Claim:
    """What a consumer's numbered call got: [start, end) of the log."""

    claim: int
    start: int
    end: int


Range = tuple[int, int]  # [start, end) of the log


@dataclass
class CursorTable:
    cursors: dict[str, int] = field(default_factory=dict)
    claims: dict[str, dict[str, Claim]] = field(default_factory=dict)  # group -> consumer
    # group -> consumer -> uncommitted ranges, oldest first ("" : orphans to redeliver)
    pending: dict[str, dict[str, list[Range]]] = field(default_factory=dict)
    # (group, consumer) -> (last heard from, session timeout), in the driver's clock;
    # not persisted
    seen: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    # ------------------------------------------------------------ at-least-once

    def touch(self, group: str, consumer: str, now: float, session_s: float) -> None:
        """`consumer` was heard from at `now`; it is gone after `session_s` of silence."""
        if consumer:
            self.seen[(group, consumer)] = (now, session_s)

    def expire(self, group: str, now: float) -> list[str]:
        """Consumers of `group` silent past their session: their pending ranges become
        orphans. Returns who went. A consumer pending since a load (no `seen` entry yet)
        starts its session at `now`."""
        gone = []
        mine = self.pending.get(group, {})
        for consumer in [c for c in mine if c != _ORPHANS]:
            last = self.seen.get((group, consumer))
            if last is None:
                self.seen[(group, consumer)] = (now, DEFAULT_SESSION_S)
            elif now - last[0] > last[1]:
                gone.append(consumer)
        for consumer in gone:
            self.orphan(group, consumer)
        return gone

    def orphan(self, group: str, consumer: str) -> None:
        """`consumer`'s pending ranges go to the orphans (it closed or is gone)."""
        mine = self.pending.get(group, {})
        ranges = mine.pop(consumer, [])
        self.seen.pop((group, consumer), None)
        if ranges:
            mine.setdefault(_ORPHANS, []).extend(ranges)
            mine[_ORPHANS].sort()

    def orphans(self, group: str) -> list[Range]:
        return self.pending.get(group, {}).get(_ORPHANS, [])

    def next_orphan(self, group: str) -> Range | None:
        orphans = self.pending.get(group, {}).get(_ORPHANS)
        return orphans[0] if orphans else None

    def settle_orphan(self, group: str, taken: Range) -> None:
        """The first orphan was handed out up to `taken[1]`: drop that part."""
        mine = self.pending[group]
        end = mine[_ORPHANS][0][1]
        if taken[1] >= end:
            mine[_ORPHANS].pop(0)
            if not mine[_ORPHANS]:
                del mine[_ORPHANS]
        else:
            mine[_ORPHANS][0] = (taken[1], end)

    def hold(self, group: str, consumer: str, taken: Range) -> None:
        """`taken` went to `consumer` and stays pending until it commits it."""
        ranges = self.pending.setdefault(group, {}).setdefault(consumer, [])
        if ranges and ranges[-1][1] == taken[0]:
            ranges[-1] = (ranges[-1][0], taken[1])
        else:
            ranges.append(taken)

    def check_room(self, pchannel: str, group: str, consumer: str) -> None:
        if len(self.pending.get(group, {}).get(consumer, ())) >= MAX_PENDING:
            raise InvalidArgument(
                f"consumer {consumer!r} of group {group!r} on {pchannel!r} has "
                f"{MAX_PENDING} uncommitted batches: commit before consuming more"
            )

    def commit(self, group: str, consumer: str, offset: int) -> int:
        """`consumer` processed every message it got up to `offset` (inclusive): its
        ranges ending at or below offset + 1 are done, one holding `offset` is cut
        after it. Returns how many ranges were settled."""
        mine = self.pending.get(group, {})
        ranges = mine.get(consumer, [])
        kept: list[Range] = []
        done = 0
        for start, end in ranges:
            if end <= offset + 1:
                done += 1
            elif start <= offset:
                kept.append((offset + 1, end))
                done += 1
            else:
                kept.append((start, end))
        if kept:
            mine[consumer] = kept
        else:
            mine.pop(consumer, None)
        return done

    def committed(self, group: str) -> int:
        """The group's committed offset: the lowest offset pending or orphaned, else the
        cursor (every message below it was processed, or was never to be delivered)."""
        starts = [r[0] for ranges in self.pending.get(group, {}).values() for r in ranges]
        return min([*starts, self.cursors[group]])

    def members(self, group: str) -> dict[str, list[Range]]:
        """Consumers with uncommitted ranges or heard from (orphans excluded)."""
        out = {c: list(r) for c, r in self.pending.get(group, {}).items() if c != _ORPHANS}
        for g, consumer in self.seen:
            if g == group:
                out.setdefault(consumer, [])
        return out

    def claimed(self, group: str, consumer: str, claim: int) -> Claim | None:
        """The range an earlier call with this claim got (a retry), if any."""
        if not consumer:
            return None
        found = self.claims.get(group, {}).get(consumer)
        return found if found is not None and found.claim == claim else None

    def record_claim(self, group: str, consumer: str, claim: Claim) -> None:
        if not consumer:
            return
        mine = self.claims.setdefault(group, {})
        mine.pop(consumer, None)  # re-inserted last: the oldest callers are dropped first
        mine[consumer] = claim
        while len(mine) > MAX_CLAIMS:
            del mine[next(iter(mine))]

    def create(self, pchannel: str, group: str, start: int) -> None:
        validate_group(group)
        if group in self.cursors:
            raise ConsumerGroupExist(
                f"consumer group {group!r} already exists on pchannel {pchannel!r}"
            )
        if len(self.cursors) >= MAX_GROUPS:
            raise InvalidArgument(
                f"pchannel {pchannel!r} has {MAX_GROUPS} consumer groups, the limit"
            )
        self.cursors[group] = start

    def get(self, pchannel: str, group: str) -> int:
        cursor = self.cursors.get(group)
        if cursor is None:
            raise ConsumerGroupNotExist(
                f"consumer group {group!r} does not exist on pchannel {pchannel!r}"
            )
        return cursor

    def destroy(self, pchannel: str, group: str) -> None:
        self.get(pchannel, group)
        del self.cursors[group]
        self.claims.pop(group, None)
        self.pending.pop(group, None)
        for key in [k for k in self.seen if k[0] == group]:
            del self.seen[key]

    def encode(self) -> bytes:
        out = [bytes([_VERSION])]
        for name, cursor in sorted(self.cursors.items()):
            claims = self.claims.get(name, {})
            out += [_name(name), _CURSOR.pack(cursor), _NAME_LEN.pack(len(claims))]
            for consumer, c in claims.items():
                out += [_name(consumer), _CLAIM.pack(c.claim, c.start, c.end)]
            pending = self.pending.get(name, {})
            out.append(_NAME_LEN.pack(len(pending)))
            for consumer, ranges in pending.items():
                out += [_name(consumer), _NAME_LEN.pack(len(ranges))]
                out += [_RANGE.pack(*r) for r in ranges]
        return b"".join(out)

    @staticmethod
    def decode(body: bytes, where: str = "") -> CursorTable:
        if not body or body[0] not in (_VERSION, _VERSION_CLAIMS, _VERSION_CURSORS):
            raise CorruptRecord(f"cursor record {where} has an unknown version")
        with_claims = body[0] != _VERSION_CURSORS
        with_pending = body[0] == _VERSION
        table = CursorTable()
        at = 1
        try:
            while at < len(body):
                name, at = _read_name(body, at)
                (table.cursors[name],) = _CURSOR.unpack_from(body, at)
                at += _CURSOR.size
                if not with_claims:
                    continue
                (count,) = _NAME_LEN.unpack_from(body, at)
                at += _NAME_LEN.size
                for _ in range(count):
                    consumer, at = _read_name(body, at)
                    claim = Claim(*_CLAIM.unpack_from(body, at))
                    at += _CLAIM.size
                    table.claims.setdefault(name, {})[consumer] = claim
                if with_pending:
                    pending: dict[str, list[Range]] = {}
                    at = _read_pending(body, at, pending)
                    if pending:
                        table.pending[name] = pending
        except (struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(f"cursor record {where} does not parse: {exc}") from None
        return table


def _read_pending(body: bytes, at: int, into: dict[str, list[Range]]) -> int:
    (consumers,) = _NAME_LEN.unpack_from(body, at)
    at += _NAME_LEN.size
    for _ in range(consumers):
        consumer, at = _read_name(body, at)
        (count,) = _NAME_LEN.unpack_from(body, at)
        at += _NAME_LEN.size
        ranges = into[consumer] = []
        for _ in range(count):
            start, end = _RANGE.unpack_from(body, at)
            at += _RANGE.size
            ranges.append((start, end))
    return at


def _name(name: str) -> bytes:
    raw = name.encode()
    return _NAME_LEN.pack(len(raw)) + raw


def _read_name(body: bytes, at: int) -> tuple[str, int]:
    (size,) = _NAME_LEN.unpack_from(body, at)
    end = at + _NAME_LEN.size + size
    if end > len(body):
        raise struct.error("name runs past the record")
    return body[at + _NAME_LEN.size : end].decode(), end


def take(
    recs: Iterable[tuple[int, Record]], cursor: int, n: int, taken: int = 0
) -> tuple[list[tuple[int, delivery.Slice]], int, int]:
    """What a consume of up to `n` messages (`taken` of them already) gets from `cursor`:
    (term, slice) pairs, the new cursor and the new count taken. Internal records and
    TimeTicks are passed over (the cursor moves past them); a txn (shared-tick record) is
    never split: it comes whole or waits for the next consume, except when nothing was
    taken yet."""
    out: list[tuple[int, delivery.Slice]] = []
    for base, rec in recs:
        end = base + rec.count
        if end <= cursor:
            continue
        if rec.internal or rec.flags & records.FLAG_TIME_TICK:
            cursor = end
            continue
        if taken >= n:
            break
        start = max(cursor, base)
        stop = min(end, start + n - taken)
        if rec.flags & records.FLAG_SHARED_TICK:
            if taken and stop < end:
                break
            stop = end
        piece = delivery.select(base, rec, cursor, _NO_FILTERS, stop)
        if piece is not None:
            out.append((rec.term, piece))
            taken += stop - start
        cursor = stop
        if stop < end:  # the rest of this record is for the next consume
            break
    return out, cursor, taken
