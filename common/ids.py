"""MessageID codec: a message's offset in its pchannel as 8 big-endian bytes.

Big-endian keeps byte order equal to numeric order, so IDs compare correctly as bytes
(the RocksDB key order relies on the same property).
"""

from __future__ import annotations

import struct

_U64 = struct.Struct(">Q")


def encode_offset(offset: int) -> bytes:
    return _U64.pack(offset)


def decode_offset(raw: bytes) -> int:
    if len(raw) != 8:
        raise ValueError(f"a MessageID is 8 bytes, got {len(raw)}")
    return _U64.unpack(raw)[0]
