"""The on-disk log record: a header and a serialized MessageBatch, as Kafka's record batch.

One RocksDB value holds many messages so that per-message work stays out of the append
and catch-up paths; message i of a record has offset base + i and tick first_tick + i.
The CRC covers header fields, extension and body, so a torn or bit-flipped value is
detected on read. A record of an idempotent producer carries (producer id, sequence) in a
header extension, so a node that copies the log also learns how to answer resends.

A committed transaction is one record with FLAG_SHARED_TICK: all its messages carry the
commit's single tick, so consumers see them together, never partially. A FLAG_CURSORS
record (a snapshot of the consumer-group cursors, node/cursors.py) takes one offset and
one tick but is never delivered to consumers; it lives in the log so that catch-up and
replication, which copy records verbatim, carry it along.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# zlib's CRC-32, computed with ISA-L's folding instructions: the same value as
# `zlib.crc32`, so records read as they always did, at ~30-50 GB/s instead of ~3.5-4
# (~1 µs per 4 KiB message, every append and every read that verifies, on the event
# loop: docs/benchmarks.md, "Large messages").
from isal.isal_zlib import crc32

from streamwal.errors import Inner

VERSION = 1
FLAG_TIME_TICK = 0x01  # the record is one TimeTick message appended by the node
FLAG_PRODUCER = 0x02  # an extension (u8 id length, id, u64 sequence) follows the header
FLAG_SHARED_TICK = 0x04  # every message of the record has first_tick (a committed txn)
FLAG_CURSORS = 0x08  # a consumer-group cursor snapshot: node bookkeeping, never delivered
# Offsets skipped after an unclean stop under async durability (Wal.open): they may have
# been acknowledged before a power loss took them, so they are never handed out again.
FLAG_SKIP = 0x10
INTERNAL_FLAGS = FLAG_CURSORS | FLAG_SKIP
# version, flags, reserved, crc32, term, first time tick, count
_HEADER = struct.Struct(">BBHIqQI")
_CHECKED = struct.Struct(">BqQI")  # the header fields the CRC covers: flags, term, tick, count
HEADER_SIZE = _HEADER.size
_SEQ = struct.Struct(">Q")


class CorruptRecord(Inner):
    """A stored record failed its checksum or does not parse."""


@dataclass(frozen=True, slots=True)
class Record:
    term: int
    first_tick: int
    count: int
    body: bytes  # serialized MessageBatch
    flags: int = 0
    producer: tuple[str, int] | None = None  # (producer id, batch sequence)

    @property
    def last_tick(self) -> int:
        return self.tick_of(self.count - 1)

    def tick_of(self, index: int) -> int:
        """The tick of message `index`: one per message, or the txn's shared tick."""
        return self.first_tick if self.flags & FLAG_SHARED_TICK else self.first_tick + index

    @property
    def internal(self) -> bool:
        return bool(self.flags & INTERNAL_FLAGS)


def encode(
    term: int,
    first_tick: int,
    count: int,
    body: bytes,
    flags: int = 0,
    producer: tuple[str, int] | None = None,
) -> bytes:
    ext = b""
    if producer is not None:
        raw_id = producer[0].encode()
        ext = bytes([len(raw_id)]) + raw_id + _SEQ.pack(producer[1])
        flags |= FLAG_PRODUCER
    checked = _CHECKED.pack(flags, term, first_tick, count)
    crc = crc32(body, crc32(ext, crc32(checked)))
    return _HEADER.pack(VERSION, flags, 0, crc, term, first_tick, count) + ext + body


def decode(value: bytes, where: str = "") -> Record:
    if len(value) < HEADER_SIZE:
        raise CorruptRecord(f"record {where} is truncated ({len(value)} bytes)")
    version, flags, _, crc, term, first_tick, count = _HEADER.unpack_from(value)
    if version != VERSION:
        raise CorruptRecord(f"record {where} has unknown version {version}")
    start = HEADER_SIZE
    producer = None
    if flags & FLAG_PRODUCER:
        if len(value) < start + 1 or len(value) < start + 1 + value[start] + _SEQ.size:
            raise CorruptRecord(f"record {where} has a truncated producer extension")
        id_len = value[start]
        seq_at = start + 1 + id_len
        try:
            producer = (value[start + 1 : seq_at].decode(), _SEQ.unpack_from(value, seq_at)[0])
        except UnicodeDecodeError:
            raise CorruptRecord(f"record {where} has a garbled producer id") from None
        start = seq_at + _SEQ.size
    ext = value[HEADER_SIZE:start]
    body = value[start:]
    checked = _CHECKED.pack(flags, term, first_tick, count)
    if crc32(body, crc32(ext, crc32(checked))) != crc:
        raise CorruptRecord(f"record {where} failed its checksum")
    return Record(term, first_tick, count, body, flags, producer)


def peek(value: bytes) -> tuple[int, int, int]:
    """(term, first tick, count) without verifying the body: for recovery and retention."""
    _, _, _, _, term, first_tick, count = _HEADER.unpack_from(value)
    return term, first_tick, count


def peek_flags(value: bytes) -> int:
    return value[1]


def ticks_used(flags: int, count: int) -> int:
    """How many clock ticks a record of `count` messages takes: one for a shared tick."""
    return 1 if flags & FLAG_SHARED_TICK else count
