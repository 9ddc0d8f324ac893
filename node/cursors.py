"""Consumer-group cursors of one pchannel (seed 001's RocksMQ groups), without I/O.

A cursor is the next offset its group gets. The whole table is small (at most
MAX_GROUPS names), so every change is persisted as a full snapshot in one internal log
record (records.FLAG_CURSORS): replaying a pchannel's cursors means decoding its newest
snapshot, never scanning the log, and whatever copies the log (catch-up, replication)
copies the cursors with it. `take` decides what a consume gets and where the cursor goes.
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
_VERSION = 1
_NAME_LEN = struct.Struct(">H")
_CURSOR = struct.Struct(">Q")
_NO_FILTERS = delivery.Filters()


def validate_group(name: str) -> None:
    raw = name.encode()
    if not raw or len(raw) > MAX_NAME_BYTES or not name.isprintable():
        raise InvalidArgument(
            f"invalid consumer group name {name!r}: 1..{MAX_NAME_BYTES} printable bytes"
        )


@dataclass
class CursorTable:
    cursors: dict[str, int] = field(default_factory=dict)

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

    def encode(self) -> bytes:
        out = [bytes([_VERSION])]
        for name, cursor in sorted(self.cursors.items()):
            raw = name.encode()
            out += [_NAME_LEN.pack(len(raw)), raw, _CURSOR.pack(cursor)]
        return b"".join(out)

    @staticmethod
    def decode(body: bytes, where: str = "") -> CursorTable:
        if not body or body[0] != _VERSION:
            raise CorruptRecord(f"cursor record {where} has an unknown version")
        table = CursorTable()
        at = 1
        try:
            while at < len(body):
                (size,) = _NAME_LEN.unpack_from(body, at)
                name = body[at + 2 : at + 2 + size].decode()
                at += 2 + size
                (table.cursors[name],) = _CURSOR.unpack_from(body, at)
                at += _CURSOR.size
        except (struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(f"cursor record {where} does not parse: {exc}") from None
        return table


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
