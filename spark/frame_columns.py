"""Arrow columns straight from a consumed frame's serialized MessageBatch, without a
Python object per message.

A batch frame carries its messages as one serialized `MessageBatch` (repeated `Message
{bytes payload = 1; map<string, string> properties = 2}`). Reading each message's fields
through the protobuf classes costs about 0.5 µs per message without properties and 1.5 µs
with a vchannel and one property of the user's: more than the Spark pipeline around it.
Here the work is done per frame: the C parser splits the batch into message bodies (one
`repeated bytes` field is wire-compatible with `repeated Message`), and numpy walks all
bodies at once, one field (one map entry) per step, to find where payloads, keys and
values lie; Arrow copies them out in C.

Only the canonical layout that protobuf encoders write is read here: payload first, then
whole map entries, each key before its value, no duplicate key. Anything else (fields in
another order, unknown fields, repeated fields, a duplicate key) makes `decode` return
None and the caller reads that frame through the protobuf classes, which give protobuf's
semantics for every valid encoding. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from streamwal.message import DEFAULT_MSG_TYPE, PROP_TERM, PROP_TIME_TICK, PROP_TYPE, PROP_VCHANNEL
from streamwal.proto import streaming_pb2 as pb

PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
PAYLOAD_TAG = 0x0A  # field 1, length-delimited (Message.payload, MapEntry.key)
ENTRY_TAG = 0x12  # field 2, length-delimited (Message.properties entry, MapEntry.value)
MAX_VARINT_BYTES = 5  # lengths below 2**35: every length a frame can hold
INLINE_VIEW_BYTES = 12  # Arrow's binary view keeps values this short inside the view
# Properties with columns of their own; never in the `properties` map.
COLUMN_KEYS = (PROP_TYPE, PROP_VCHANNEL, PROP_TIME_TICK, PROP_TERM)
_COLUMN_KEY_SET = frozenset(COLUMN_KEYS)
_NO_STRINGS = pa.array([], pa.string())


def _raw_batch_class() -> type:
    """`message RawMessageBatch { repeated bytes messages = 1; }` in a private pool: the
    same wire format as MessageBatch, each message left as its serialized body."""
    file = descriptor_pb2.FileDescriptorProto(
        name="streamwal_spark_raw_batch.proto", package="streamwal.spark", syntax="proto3"
    )
    message = file.message_type.add(name="RawMessageBatch")
    message.field.add(
        name="messages",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("streamwal.spark.RawMessageBatch")
    )


RawMessageBatch = _raw_batch_class()


@dataclass(frozen=True)
class FrameColumns:
    """One frame's messages as Arrow arrays, in frame order."""

    payload: pa.Array  # binary
    vchannel: pa.Array  # string, null where the message has none
    message_type: pa.Array  # int32
    properties: pa.Array  # map<string, string> of the keys without a column


class _Layout(Exception):
    """The bytes are not in the canonical layout this decoder reads."""


def _varints(data: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and byte sizes of the varints that start at each of `pos` (`data` is padded
    with zero bytes, so reading a few bytes past a body stays inside it)."""
    byte = data[pos].astype(np.int64)
    value = byte & 0x7F
    size = np.ones(len(pos), np.int64)
    going = byte >= 0x80
    for k in range(1, MAX_VARINT_BYTES):
        if not going.any():  # most lengths take one byte: one round
            return value, size
        byte = data[pos + k].astype(np.int64)
        value |= np.where(going, (byte & 0x7F) << (7 * k), 0)
        size += going
        going &= byte >= 0x80
    if going.any():
        raise _Layout("a varint longer than 5 bytes")
    return value, size


def _field(
    data: np.ndarray, start: np.ndarray, end: np.ndarray, tag: int
) -> tuple[np.ndarray, np.ndarray]:
    """Where the value of an optional length-delimited field `tag` at `start` lies:
    (value start, value end); both `start` where the field is absent (proto3 leaves out
    empty values). Raises _Layout if a value would run past `end`."""
    present = (start < end) & (data[start] == tag)
    length, size = _varints(data, start + 1)
    value_start = np.where(present, start + 1 + size, start)
    value_end = np.where(present, value_start + length, start)
    if (value_end > end).any():
        raise _Layout("a field runs past its message")
    return value_start, value_end


def slices(data: np.ndarray, buffer: pa.Buffer, start: np.ndarray, end: np.ndarray) -> pa.Array:
    """The byte strings data[start:end] as one binary array (built as Arrow binary views,
    16 bytes per value pointing into `buffer` = `data`, then copied out by Arrow's cast)."""
    n = len(start)
    length = (end - start).astype(np.int32)
    views = np.zeros((n, 4), np.int32)
    views[:, 0] = length
    # bytes 4..15 of a view: a short value itself, zero-padded; else its 4-byte prefix,
    # the data buffer's index (0) and the value's offset in it
    short = length <= INLINE_VIEW_BYTES
    rows = slice(None) if short.all() else np.flatnonzero(short)
    if short.any():
        head = np.lib.stride_tricks.sliding_window_view(data, INLINE_VIEW_BYTES)[start[rows]]
        columns = np.arange(INLINE_VIEW_BYTES)
        views.view(np.uint8)[rows, 4:] = np.where(columns < length[rows, None], head, 0)
    if not short.all():
        rows = slice(None) if not short.any() else np.flatnonzero(~short)
        prefix = np.lib.stride_tricks.sliding_window_view(data, 4)[start[rows]]
        views[rows, 1] = prefix.view(np.int32)[:, 0]
        views[rows, 3] = start[rows]
    array = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), buffer])
    return array.cast(pa.binary())


def _utf8(array: pa.Array) -> pa.Array:
    try:
        return array.cast(pa.string())  # checks UTF-8, as the protobuf parser does
    except pa.ArrowInvalid as exc:
        raise _Layout(str(exc)) from None


def _entries(
    data: np.ndarray, body_end: np.ndarray, cursor: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every map entry of every body, in wire order within each message: (message index,
    key start, key end, value start, value end). One round reads one entry of every
    message that still has bytes after `cursor`."""
    rounds = []
    cursor = cursor.copy()
    while True:
        active = np.flatnonzero(cursor < body_end)
        if not len(active):
            break
        at, end = cursor[active], body_end[active]
        if (data[at] != ENTRY_TAG).any():
            raise _Layout("a field other than a properties entry after the payload")
        entry_start, entry_end = _field(data, at, end, ENTRY_TAG)
        key_start, key_end = _field(data, entry_start, entry_end, PAYLOAD_TAG)
        value_start, value_end = _field(data, key_end, entry_end, ENTRY_TAG)
        if (value_end != entry_end).any():
            raise _Layout("a map entry with fields out of order or unknown")
        rounds.append((active, key_start, key_end, value_start, value_end))
        cursor[active] = entry_end
    if not rounds:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty, empty
    if len(rounds) == 1:
        return rounds[0]
    message, *spans = (np.concatenate(parts) for parts in zip(*rounds, strict=True))
    order = np.argsort(message, kind="stable")  # by message; each message's in wire order
    return message[order], *(s[order] for s in spans)


@dataclass(frozen=True)
class _Properties:
    """All map entries of a frame: entry i belongs to message `message[i]` and has key
    `names[key_ids[i]]` and value `values[i]`."""

    message: np.ndarray
    key_ids: np.ndarray
    names: pa.Array  # string: the distinct keys
    values: pa.Array  # string

    def lookup(self, n: int, key: str) -> pa.Array:
        """The value of `key` for each of `n` messages, null where a message lacks it."""
        index = np.full(n, -1, np.int64)
        names = self.names.to_pylist()
        if key in names:
            hit = np.flatnonzero(self.key_ids == names.index(key))
            index[self.message[hit]] = hit
        return self.values.take(pa.array(index, mask=index < 0))

    def map_without(self, n: int, column_keys: tuple[str, ...]) -> pa.Array:
        """Each message's entries as a map, keys with a column of their own left out."""
        own = ~pc.is_in(self.names, pa.array(column_keys)).to_numpy(zero_copy_only=False)
        kept = np.flatnonzero(own[self.key_ids])
        counts = np.bincount(self.message[kept], minlength=n)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return pa.MapArray.from_arrays(
            pa.array(offsets), self.names.take(self.key_ids[kept]), self.values.take(kept)
        )


def _properties(data: np.ndarray, buffer: pa.Buffer, spans: tuple[np.ndarray, ...]) -> _Properties:
    message, key_start, key_end, value_start, value_end = spans
    keys = pc.dictionary_encode(slices(data, buffer, key_start, key_end))
    key_ids = keys.indices.to_numpy().astype(np.int64)
    names = _utf8(keys.dictionary)  # few distinct keys: checked once each
    pairs = np.sort(message * len(names) + key_ids)
    if (pairs[1:] == pairs[:-1]).any():
        raise _Layout("a key twice in one message (the last one would win)")
    values = _utf8(slices(data, buffer, value_start, value_end))
    return _Properties(message, key_ids, names, values)


def split(serialized: bytes) -> pa.Array:
    """The message bodies of a serialized MessageBatch (a frame) as a binary array."""
    return pa.array(RawMessageBatch.FromString(serialized).messages, pa.binary())


def decode(bodies: pa.Array) -> FrameColumns | None:
    """The columns of serialized Messages (`split`'s bodies; several frames' bodies at
    once cost the numpy and Arrow calls once), or None if their layout is not canonical."""
    n = len(bodies)
    offsets = np.frombuffer(bodies.buffers()[1], np.int32, n + 1).astype(np.int64)
    raw = np.frombuffer(bodies.buffers()[2] or b"", np.uint8, offsets[-1])
    data = np.concatenate([raw, np.zeros(INLINE_VIEW_BYTES, np.uint8)])  # see _varints
    buffer = pa.py_buffer(data)
    body_start, body_end = offsets[:-1], offsets[1:]
    try:
        payload_start, payload_end = _field(data, body_start, body_end, PAYLOAD_TAG)
        if (payload_end == body_end).all():  # no message has properties: nothing to walk
            return FrameColumns(
                payload=slices(data, buffer, payload_start, payload_end),
                vchannel=pa.nulls(n, pa.string()),
                message_type=pa.repeat(pa.scalar(int(DEFAULT_MSG_TYPE), pa.int32()), n),
                properties=pa.MapArray.from_arrays(
                    pa.array(np.zeros(n + 1, np.int32)), _NO_STRINGS, _NO_STRINGS
                ),
            )
        props = _properties(data, buffer, _entries(data, body_end, payload_end))
        types = props.lookup(n, PROP_TYPE)
        message_type = pc.if_else(pc.equal(types, ""), None, types).cast(pa.int32())
    except (_Layout, pa.ArrowInvalid):  # ArrowInvalid: a message type that is no int32
        return None
    return FrameColumns(
        payload=slices(data, buffer, payload_start, payload_end),
        vchannel=props.lookup(n, PROP_VCHANNEL),
        message_type=message_type.fill_null(int(DEFAULT_MSG_TYPE)),
        properties=props.map_without(n, COLUMN_KEYS),
    )


def from_messages(messages: Sequence[pb.Message]) -> FrameColumns:
    """The same columns through the protobuf classes, a message at a time: for frames
    `decode` does not read, and single-message frames."""
    vchannels, types, props = [], [], []
    default_type = int(DEFAULT_MSG_TYPE)
    for m in messages:  # one pass over each message's properties
        p = m.properties
        if not p:
            vchannels.append(None)
            types.append(default_type)
            props.append([])
            continue
        vchannel = p.get(PROP_VCHANNEL)
        t = p.get(PROP_TYPE)
        vchannels.append(vchannel)
        types.append(int(t) if t else default_type)
        if len(p) == (vchannel is not None) + (t is not None):
            props.append([])  # no key of the user's: skip the (slow) items() walk
        else:
            props.append([(k, v) for k, v in p.items() if k not in _COLUMN_KEY_SET])
    return FrameColumns(
        payload=pa.array([m.payload for m in messages], pa.binary()),
        vchannel=pa.array(vchannels, pa.string()),
        message_type=pa.array(types, pa.int32()),
        properties=pa.array(props, PROPERTIES_TYPE),
    )
