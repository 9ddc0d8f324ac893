"""The sink's rows as MessageBatch entries, built a column at a time; and the cut of a
pchannel's entries into batches.

An entry is one element of MessageBatch.messages, the bytes client/encoding.encode_entry
writes: `0x0a len(message) message`, the message being `0x0a len(payload) payload` (left
out when empty) followed by its properties' map entries. Encoding row by row costs a
microsecond or more per message in Python; here a batch of rows costs a few numpy and
Arrow calls. Properties are encoded once per distinct (vchannel, message type) pair,
which is all most rows have; a row with properties of its own goes through
encoding.encode_properties as before. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamwal.client import encoding
from streamwal.errors import InvalidArgument
from streamwal.message import pchannel_of

FIELD_TAG = 0x0A  # field 1, length-delimited: MessageBatch.messages, Message.payload
MAX_VARINT_BYTES = 5
HEADER_BYTES = 12  # entry tag + length (<= 5), payload tag + length (<= 5): at most 12


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 5) uint8 varint encodings of `values` (< 2**35) and their sizes."""
    out = np.zeros((len(values), MAX_VARINT_BYTES), np.uint8)
    size = np.ones(len(values), np.int64)
    rest = values.astype(np.int64)
    for k in range(MAX_VARINT_BYTES):
        more = rest >= 0x80
        out[:, k] = (rest & 0x7F) | (more << 7)
        if not more.any():
            break
        rest = rest >> 7
        size += more
    return out, size


def _binary(column: pa.Array, name: str) -> pa.Array:
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    raise InvalidArgument(f"the sink's column {name} must be binary, got {column.type}")


def _codes(column: pa.Array) -> tuple[list, np.ndarray]:
    """The distinct values of `column` (None first) and each row's index into them."""
    encoded = pc.dictionary_encode(column)
    return [None, *encoded.dictionary.to_pylist()], encoded.indices.fill_null(-1).to_numpy() + 1


def _properties(batch: pa.RecordBatch) -> pa.Array | None:
    """Each row's encoded properties (map entries of _vc, _t and its own) as binary, or
    None when no row has any."""
    n = batch.num_rows
    names = batch.schema.names
    if not {"vchannel", "message_type", "properties"} & set(names):
        return None
    vchannel = batch.column("vchannel") if "vchannel" in names else pa.nulls(n, pa.string())
    msg_type = batch.column("message_type") if "message_type" in names else pa.nulls(n, pa.int32())
    # One blob per (vchannel, message type) pair present: rows hold an index into them.
    vchannels, vch_ids = _codes(vchannel.cast(pa.string()))
    types, type_ids = _codes(msg_type.cast(pa.int64()))
    pair = vch_ids.astype(np.int64) * len(types) + type_ids
    present = np.zeros(len(vchannels) * len(types), bool)
    present[pair] = True
    blobs = []
    for code in np.flatnonzero(present).tolist():
        v, t = divmod(code, len(types))
        props = encoding.message_properties(vchannels[v], types[t], None)
        blobs.append(encoding.encode_properties(props))
    index_of = np.cumsum(present) - 1
    per_row = pa.array(blobs, pa.binary()).take(pa.array(index_of[pair]))
    if "properties" not in names:
        return per_row
    own = batch.column("properties")
    has_own = np.flatnonzero(np.diff(own.offsets.to_numpy()) > 0)
    if not len(has_own):
        return per_row
    encoded = per_row.to_pylist()
    vchannels, msg_types, maps = (
        vchannel.take(pa.array(has_own)).to_pylist(),
        msg_type.take(pa.array(has_own)).to_pylist(),
        own.take(pa.array(has_own)).to_pylist(),
    )
    for i, v, t, m in zip(has_own.tolist(), vchannels, msg_types, maps, strict=True):
        try:
            props = encoding.message_properties(v, t, dict(m))
        except ValueError as exc:
            raise InvalidArgument(f"the sink's column properties: {exc}") from None
        encoded[i] = encoding.encode_properties(props)
    return pa.array(encoded, pa.binary())


def _short_binary(matrix: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Row i of `matrix` (n x 12 bytes, zero past lengths[i]) as a binary array: Arrow
    binary views keep values of up to 12 bytes inside the view, so no gather is needed."""
    views = np.zeros((len(lengths), 4), np.int32)
    views[:, 0] = lengths
    views.view(np.uint8)[:, 4:] = matrix
    array = pa.Array.from_buffers(pa.binary_view(), len(lengths), [None, pa.py_buffer(views)])
    return array.cast(pa.binary())


def encode(batch: pa.RecordBatch) -> pa.Array:
    """One entry (binary) per row of `batch` (columns as the sink takes them)."""
    n = batch.num_rows
    payload = _binary(batch.column("payload"), "payload").fill_null(b"")
    props = _properties(batch)
    payload_len = pc.binary_length(payload).to_numpy().astype(np.int64)
    props_len = 0 if props is None else pc.binary_length(props).to_numpy().astype(np.int64)
    has_payload = payload_len > 0
    payload_varint, payload_varint_size = _varint_bytes(payload_len)
    payload_field = np.where(has_payload, 1 + payload_varint_size + payload_len, 0)
    entry_varint, entry_varint_size = _varint_bytes(payload_field + props_len)
    # Each row's header: tag, varint(message length), then (with a payload) tag and
    # varint(payload length); the payload and the properties follow it.
    headers = np.zeros((n, HEADER_BYTES), np.uint8)
    headers[:, 0] = FIELD_TAG
    headers[:, 1 : 1 + MAX_VARINT_BYTES] = entry_varint  # zeros past its size
    payload_head = np.zeros((n, 1 + MAX_VARINT_BYTES), np.uint8)
    payload_head[:, 0] = FIELD_TAG
    payload_head[:, 1:] = payload_varint
    payload_head[~has_payload] = 0
    for size in np.unique(entry_varint_size).tolist():  # mostly one size for all rows
        rows = entry_varint_size == size
        headers[rows, 1 + size : 1 + size + 1 + MAX_VARINT_BYTES] = payload_head[rows]
    header_len = 1 + entry_varint_size + np.where(has_payload, 1 + payload_varint_size, 0)
    parts = [_short_binary(headers, header_len), payload]
    if props is not None:
        parts.append(props)
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))


def pchannels(batch: pa.RecordBatch, default: str | None) -> tuple[list[str], np.ndarray]:
    """Where each row goes: its `pchannel`, else its vchannel's pchannel, else `default`.
    Returns the distinct pchannels and each row's index into them."""
    n = batch.num_rows
    names = batch.schema.names
    column = batch.column("pchannel").cast(pa.string()) if "pchannel" in names else None
    vchannel = batch.column("vchannel").cast(pa.string()) if "vchannel" in names else None
    derived = pa.nulls(n, pa.string())
    if vchannel is not None:
        vch = pc.dictionary_encode(vchannel)
        mapped = pa.array([pchannel_of(v) if v else None for v in vch.dictionary.to_pylist()],
                          pa.string())  # fmt: skip
        derived = mapped.take(vch.indices)
    target = derived if column is None else pc.coalesce(
        pc.if_else(pc.equal(column, ""), None, column), derived
    )  # fmt: skip
    target = pc.if_else(pc.equal(target, ""), None, target)
    if default is not None:
        target = target.fill_null(default)
    if target.null_count:
        raise InvalidArgument("a row has neither pchannel nor vchannel (and no option pchannel)")
    encoded = pc.dictionary_encode(target)
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy().astype(np.int64)


@dataclass
class OpenBatch:
    """The entries of a pchannel's batch being filled (whole runs of bytes) and its size."""

    chunks: list[bytes]
    size: int = 0
    count: int = 0


def cut(
    entries: pa.Array, open_batch: OpenBatch, max_rows: int, max_bytes: int
) -> list[tuple[list[bytes], int]]:
    """Add `entries` to `open_batch` and return the batches that fill up, as (chunks,
    count). A batch closes at `max_rows` entries, or before an entry that would take it
    over `max_bytes` (an entry alone may be larger): the same cut for the same rows
    however Spark splits them into Arrow batches, so a retried task numbers its batches
    as the first attempt did."""
    offsets = np.frombuffer(entries.buffers()[1], np.int32, len(entries) + 1, entries.offset * 4)
    data = entries.buffers()[2]
    out = []
    pos, n = 0, len(entries)
    while pos < n:
        budget = offsets[pos] + max_bytes - open_batch.size
        end = min(n, pos + max_rows - open_batch.count,
                  int(np.searchsorted(offsets, budget, side="right")) - 1)  # fmt: skip
        if end <= pos and open_batch.count == 0:
            end = pos + 1  # an entry larger than max_bytes: a batch of its own
        if end > pos:
            open_batch.chunks.append(data[offsets[pos] : offsets[end]].to_pybytes())
            open_batch.size += int(offsets[end] - offsets[pos])
            open_batch.count += end - pos
            pos = end
        if open_batch.count >= max_rows or pos < n:  # full, or the next entry does not fit
            out.append((open_batch.chunks, open_batch.count))
            open_batch.chunks, open_batch.size, open_batch.count = [], 0, 0
    return out
