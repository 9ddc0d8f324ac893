"""The sink's column-wise encoding against the client's row-wise one, its routing, and a
cut into batches that does not depend on how Spark splits the rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from streamwal.client import encoding
from streamwal.errors import InvalidArgument
from streamwal.proto import streaming_pb2 as pb
from streamwal.spark import entries

SCHEMA = pa.schema([
    ("payload", pa.binary()), ("vchannel", pa.string()), ("pchannel", pa.string()),
    ("message_type", pa.int64()), ("properties", pa.map_(pa.string(), pa.string())),
])  # fmt: skip


def random_rows(rng: random.Random, n: int) -> list[dict]:
    return [
        {
            "payload": rng.choice([None, b"", b"x", rng.randbytes(128), rng.randbytes(20_000)]),
            "vchannel": rng.choice([None, "p_0_v1", "p_1_v2", "ключ_3_v"]),
            "pchannel": rng.choice([None, "", "q_0"]),
            "message_type": rng.choice([None, 1, 1200]),
            "properties": rng.choice([None, [], [("k", "v")], [("b", ""), ("a", "値")]]),
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize("seed", range(4))
def test_entries_are_the_bytes_the_client_writes(seed):
    rows = random_rows(random.Random(seed), 500)
    got = entries.encode(pa.RecordBatch.from_pylist(rows, schema=SCHEMA)).to_pylist()
    want = [
        encoding.encode_entry(
            r["payload"] or b"",
            encoding.encode_properties(encoding.message_properties(
                r["vchannel"], r["message_type"], dict(r["properties"] or ()))),
        )
        for r in rows
    ]  # fmt: skip
    assert got == want
    parsed = pb.MessageBatch.FromString(b"".join(got)).messages  # and they parse
    assert [m.payload for m in parsed] == [r["payload"] or b"" for r in rows]


def test_a_payload_only_batch_and_routing():
    batch = pa.RecordBatch.from_pydict({"payload": [b"a", b"", b"c" * 300]})
    assert entries.encode(batch).to_pylist() == [
        encoding.encode_entry(p) for p in (b"a", b"", b"c" * 300)
    ]
    rows = pa.RecordBatch.from_pylist(
        [{"payload": b"1", "vchannel": "p_0_v", "pchannel": None},
         {"payload": b"2", "vchannel": "p_0_v", "pchannel": "x_9"},
         {"payload": b"3", "vchannel": None, "pchannel": ""}],
        schema=pa.schema([("payload", pa.binary()), ("vchannel", pa.string()),
                          ("pchannel", pa.string())]),
    )  # fmt: skip
    names, index = entries.pchannels(rows, "dflt")
    assert [names[i] for i in index] == ["p_0", "x_9", "dflt"]
    with pytest.raises(InvalidArgument, match="neither pchannel nor vchannel"):
        entries.pchannels(rows, None)


def test_reserved_keys_and_payload_types_are_refused():
    schema = pa.schema([SCHEMA.field("payload"), SCHEMA.field("properties")])
    props = pa.RecordBatch.from_pylist([{"payload": b"x", "properties": [("_tt", "1")]}], schema)
    with pytest.raises(InvalidArgument, match="reserved"):
        entries.encode(props)
    with pytest.raises(InvalidArgument, match="column payload must be binary"):
        entries.encode(pa.RecordBatch.from_pydict({"payload": [1, 2]}))


def batches_of(encoded: pa.Array, sizes: list[int]) -> list[tuple[bytes, int]]:
    open_batch, out, at = entries.OpenBatch([]), [], 0
    for size in sizes:
        out += entries.cut(encoded.slice(at, size), open_batch, 7, 1000)
        at += size
    if open_batch.count:
        out.append((open_batch.chunks, open_batch.count))
    return [(b"".join(chunks), count) for chunks, count in out]


def test_the_cut_is_the_same_however_the_rows_are_split():
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice([1, 50, 300, 1500])) for _ in range(200)]
    encoded = entries.encode(pa.RecordBatch.from_pydict({"payload": payloads}))
    whole = batches_of(encoded, [200])
    assert batches_of(encoded, [1] * 200) == whole
    assert batches_of(encoded, [13, 1, 100, 86]) == whole
    assert b"".join(b for b, _ in whole) == b"".join(encoded.to_pylist())  # all, in order
    for body, count in whole:
        assert count <= 7 and (len(body) <= 1000 or count == 1)  # a big entry goes alone
