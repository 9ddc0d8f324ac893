"""The on-disk log record: a header and a serialized MessageBatch, as Kafka's record batch.

One RocksDB value holds many messages so that per-message work stays out of the append
and catch-up paths; message i of a record has offset base + i and tick first_tick + i.
The CRC covers header fields and body, so a torn or bit-flipped value is detected on read.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from streamwal.errors import Inner

VERSION = 1
FLAG_TIME_TICK = 0x01  # the record is one TimeTick message appended by the node
# version, flags, reserved, crc32, term, first time tick, count
_HEADER = struct.Struct(">BBHIqQI")
_CHECKED = struct.Struct(">BqQI")  # the header fields the CRC covers: flags, term, tick, count
HEADER_SIZE = _HEADER.size


class CorruptRecord(Inner):
    """A stored record failed its checksum or does not parse."""


@dataclass(frozen=True, slots=True)
class Record:
    term: int
    first_tick: int
    count: int
    body: bytes  # serialized MessageBatch
    flags: int = 0

    @property
    def last_tick(self) -> int:
        return self.first_tick + self.count - 1


def encode(term: int, first_tick: int, count: int, body: bytes, flags: int = 0) -> bytes:
    checked = _CHECKED.pack(flags, term, first_tick, count)
    crc = zlib.crc32(body, zlib.crc32(checked))
    return _HEADER.pack(VERSION, flags, 0, crc, term, first_tick, count) + body


def decode(value: bytes, where: str = "") -> Record:
    if len(value) < HEADER_SIZE:
        raise CorruptRecord(f"record {where} is truncated ({len(value)} bytes)")
    version, flags, _, crc, term, first_tick, count = _HEADER.unpack_from(value)
    if version != VERSION:
        raise CorruptRecord(f"record {where} has unknown version {version}")
    body = value[HEADER_SIZE:]
    if zlib.crc32(body, zlib.crc32(_CHECKED.pack(flags, term, first_tick, count))) != crc:
        raise CorruptRecord(f"record {where} failed its checksum")
    return Record(term, first_tick, count, body, flags)


def peek(value: bytes) -> tuple[int, int, int]:
    """(term, first tick, count) without verifying the body: for recovery and retention."""
    _, _, _, _, term, first_tick, count = _HEADER.unpack_from(value)
    return term, first_tick, count
