"""Hand-written protobuf encoding of the client's produce hot path (see protowire).

Writing the wire format directly keeps a 128-byte message well under a microsecond.
The bytes are exactly what protoc's code would produce for MessageBatch and
ProduceRequest{produce_batch}, and the tests parse them back with the generated classes.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamwal.message import PROP_TYPE, PROP_VCHANNEL
from streamwal.protowire import varint


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


def encode_entry(payload: bytes, props_blob: bytes = b"") -> bytes:
    """One element of MessageBatch.messages (field 1), properties already encoded."""
    msg = (b"\n" + varint(len(payload)) + payload if payload else b"") + props_blob
    return b"\n" + varint(len(msg)) + msg


def produce_batch_frame(
    request_id: int, body: bytes, sequence: int = 0, barrier_time_tick: int = 0
) -> bytes:
    """A serialized ProduceRequest{produce_batch: {request_id, messages: body, sequence,
    barrier_time_tick}}."""
    inner = b"\x08" + varint(request_id) + b"\x12" + varint(len(body)) + body
    if sequence:
        inner += b"\x18" + varint(sequence)
    if barrier_time_tick:
        inner += b"\x50" + varint(barrier_time_tick)  # field 10, varint
    return b"R" + varint(len(inner)) + inner


def close_frame() -> bytes:
    """A serialized ProduceRequest{close: {}}."""
    return b"\x1a\x00"
