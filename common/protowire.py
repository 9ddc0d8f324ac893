"""Protobuf wire format written by hand on the produce hot path, for node and client.

Building one protobuf object per message costs microseconds in Python; writing the wire
format directly (a few tagged varints and length-prefixed byte strings) costs a fraction
of that. The bytes are exactly what protoc's code would produce, and the tests parse
them back with the generated classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from streamwal.ids import encode_offset
from streamwal.message import PROP_TYPE, PROP_VCHANNEL

# Numbers encode 14 bits per table lookup: lengths and counts take one, a time tick
# (about 2**50) four instead of eight rounds of bit twiddling.
_VARINT_TABLE = [
    bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(1 << 14)
]
_CONTINUED = [bytes([(n & 0x7F) | 0x80, (n >> 7) | 0x80]) for n in range(1 << 14)]


def varint(n: int) -> bytes:
    if 0 <= n < 16384:
        return _VARINT_TABLE[n]
    if n < 0:  # (a negative index would pick a wrong entry of the table, silently)
        raise ValueError(f"varint of a negative number: {n}")
    parts = []
    while n >= 16384:
        parts.append(_CONTINUED[n & 0x3FFF])
        n >>= 14
    parts.append(_VARINT_TABLE[n])
    return b"".join(parts)


def produce_batch_answer(
    request_id: int, base: int, count: int, first_tick: int, duplicate: bool
) -> bytes:
    """A serialized ProduceResponse{produce_batch: {request_id, result: {first_id: base,
    count, first_time_tick, duplicate}}}: the node's answer to an appended batch."""
    result = b"\n\n\n\x08" + encode_offset(base)  # first_id: MessageID{id: 8 bytes}
    if count:
        result += b"\x10" + varint(count)
    if first_tick:
        result += b"\x18" + varint(first_tick)
    if duplicate:
        result += b"\x20\x01"
    inner = b"\x12" + varint(len(result)) + result
    if request_id:  # an int64: a negative one is sent as its 64-bit two's complement
        inner = b"\x08" + varint(request_id if request_id > 0 else request_id + 2**64) + inner
    return b"R" + varint(len(inner)) + inner


def log_entry(term: int, commit_offset: int, offset: int, records: Sequence[bytes]) -> bytes:
    """A serialized LogEntry{offset, record: records[0], term, commit_offset, next_records:
    records[1:]}: what a leader streams to a follower, as protoc writes it (fields in
    number order, zeros left out), with one copy of the records: building and serializing
    a LogEntry of 1 / 2 / 8 records of 67 KB took 6 / 13 / 81 us (and, until glibc's
    dynamic mmap threshold had risen, 100-1,900 us in page faults); joined, 2.4 / 4 / 27 us
    (docs/benchmarks.md, "Replicated path")."""
    parts = [b"\x08", varint(offset)] if offset else []
    if records[0]:
        parts += (b"\x12", varint(len(records[0])), records[0])
    parts += (b"\x18", varint(term))  # a term is >= 1
    if commit_offset:
        parts += (b"\x20", varint(commit_offset))
    for record in records[1:]:
        parts += (b"\x3a", varint(len(record)), record)
    return b"".join(parts)


def _field_bytes(tag: bytes, value: bytes) -> bytes:
    return tag + varint(len(value)) + value


def encode_properties(props: Mapping[str, str]) -> bytes:
    """The `properties` map field (2) of a Message, in key order for stable bytes."""
    out = []
    for key in sorted(props):
        entry = _field_bytes(b"\n", key.encode()) + _field_bytes(b"\x12", str(props[key]).encode())
        out.append(_field_bytes(b"\x12", entry))
    return b"".join(out)


def message_properties(
    vchannel: str | None, msg_type: int | None, properties: Mapping[str, str] | None
) -> dict[str, str]:
    props = dict(properties or {})
    for key in props:
        if key.startswith("_") and key not in (PROP_VCHANNEL, PROP_TYPE):
            raise ValueError(f"property key {key!r}: keys starting with '_' are reserved")
    if vchannel is not None:
        props[PROP_VCHANNEL] = vchannel
    if msg_type is not None:
        props[PROP_TYPE] = str(int(msg_type))
    return props


_BYTES_LIKE = (bytes, bytearray, memoryview)


def encode_entry(payload: bytes, props_blob: bytes = b"") -> bytes:
    """One element of MessageBatch.messages (field 1), properties already encoded.

    Every producer path encodes here, so a payload of the wrong type is refused here with
    a clear TypeError (a str used to fail as "can't concat str to bytes")."""
    # (bytes, the common case, first: an isinstance of a `bytes | ...` union built at
    # each call made encoding a small message a third slower; docs/benchmarks.md)
    if type(payload) is not bytes and not isinstance(payload, _BYTES_LIKE):
        hint = ": encode it first, e.g. text.encode()" if isinstance(payload, str) else ""
        raise TypeError(f"a message payload is bytes, not {type(payload).__name__}{hint}")
    msg = (b"\n" + varint(len(payload)) + payload if payload else b"") + props_blob
    return b"\n" + varint(len(msg)) + msg


def encode_entries(payloads: Iterable[bytes], props_blob: bytes = b"") -> list[bytes]:
    """`encode_entry` of each payload, for a batch sharing its properties: the bytes before
    a payload depend only on its length, so they are made once per length and each entry
    is one concatenation (512 same-size payloads: ~3x less CPU than one encode_entry
    each, which was most of a pipelining client's CPU; docs/benchmarks.md, "Replicated path")."""
    heads: dict[int, bytes] = {}
    out = []
    for payload in payloads:
        if type(payload) is not bytes:  # bytearray, memoryview, or refused with its hint
            out.append(encode_entry(payload, props_blob))
            continue
        size = len(payload)
        head = heads.get(size)
        if head is None:
            inner = b"\n" + varint(size) if size else b""
            head = heads[size] = b"\n" + varint(len(inner) + size + len(props_blob)) + inner
        out.append(head + payload + props_blob)
    return out
