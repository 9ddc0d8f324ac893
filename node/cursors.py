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
_VERSION = 2  # cursors, then each group's claims
_NAME_LEN = struct.Struct(">H")
_CURSOR = struct.Struct(">Q")
_CLAIM = struct.Struct(">QQQ")  # claim, first offset, end offset
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


@dataclass
class CursorTable:
    cursors: dict[str, int] = field(default_factory=dict)
    claims: dict[str, dict[str, Claim]] = field(default_factory=dict)  # group -> consumer

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

    def encode(self) -> bytes:
        out = [bytes([_VERSION])]
        for name, cursor in sorted(self.cursors.items()):
            claims = self.claims.get(name, {})
            out += [_name(name), _CURSOR.pack(cursor), _NAME_LEN.pack(len(claims))]
            for consumer, c in claims.items():
                out += [_name(consumer), _CLAIM.pack(c.claim, c.start, c.end)]
        return b"".join(out)

    @staticmethod
    def decode(body: bytes, where: str = "") -> CursorTable:
        if not body or body[0] not in (_VERSION, _VERSION_CURSORS):
            raise CorruptRecord(f"cursor record {where} has an unknown version")
        with_claims = body[0] == _VERSION
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
        except (struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(f"cursor record {where} does not parse: {exc}") from None
        return table


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
