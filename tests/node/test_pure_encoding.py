"""Pure: the hand-written wire encoding (client requests, node answers) equals protoc's,
byte for byte."""

from __future__ import annotations

import pytest

from streamwal import protowire
from streamwal.client import encoding
from streamwal.ids import encode_offset
from streamwal.proto import streaming_pb2 as pb

SIZES = [0, 1, 127, 128, 300, 16383, 16384, 70_000, 2_100_000]
PROPS = [
    {},
    {"_vc": "pch_v1"},
    {"_vc": "pch_v1", "_t": "401", "user": "x" * 200, "e": ""},
    {"k" * 130: "v" * 20_000},
]


def _payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


@pytest.mark.parametrize(
    "n",
    [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**35, 2**50 + 12345, 2**64 - 1],
)
def test_varint_matches_protobuf(n: int) -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    assert encoding.varint(n) == _VarintBytes(n)


def test_varint_refuses_negative_numbers() -> None:
    with pytest.raises(ValueError, match="negative"):
        protowire.varint(-1)


@pytest.mark.parametrize(
    ("request_id", "base", "count", "tick", "duplicate"),
    [
        (1, 0, 1, 0, False),
        (0, 5, 0, 0, False),
        (300, 2**40, 16384, 2**53 + 7, True),
        (2**35, 12345, 8192, 470675927692214272, False),
        (-1411, 3, 1, 7, False),  # int64 request ids may be negative (found by the fuzzer)
        (-(2**63), 3, 1, 7, False),
        (2**63 - 1, 3, 1, 7, False),
    ],
)
def test_the_nodes_batch_answer_equals_protoc(
    request_id: int, base: int, count: int, tick: int, duplicate: bool
) -> None:
    expected = pb.ProduceResponse(
        produce_batch=pb.ProduceBatchResponse(
            request_id=request_id,
            result=pb.ProduceBatchResult(
                first_id=pb.MessageID(id=encode_offset(base)),
                count=count,
                first_time_tick=tick,
                duplicate=duplicate,
            ),
        )
    )
    answer = protowire.produce_batch_answer(request_id, base, count, tick, duplicate)
    assert answer == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("props", PROPS, ids=range(len(PROPS)))
def test_entry_equals_protoc(size: int, props: dict[str, str]) -> None:
    payload = _payload(size)
    entry = encoding.encode_entry(payload, encoding.encode_properties(props))
    expected = pb.MessageBatch(messages=[pb.Message(payload=payload, properties=props)])
    assert entry == expected.SerializeToString(deterministic=True)
    parsed = pb.MessageBatch.FromString(entry).messages[0]
    assert parsed.payload == payload and dict(parsed.properties) == props


@pytest.mark.parametrize("props", PROPS, ids=range(len(PROPS)))
def test_a_batchs_entries_equal_protoc(props: dict[str, str]) -> None:
    """encode_entries: sizes repeated (their heads made once) and mixed, bytes-likes."""
    payloads: list = [_payload(size) for size in [*SIZES, *SIZES]]
    payloads += [bytearray(b"ba"), memoryview(b"mv"), _payload(1), b""]
    body = b"".join(encoding.encode_entries(payloads, encoding.encode_properties(props)))
    expected = pb.MessageBatch(
        messages=[pb.Message(payload=bytes(p), properties=props) for p in payloads]
    )
    assert body == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize("request_id", [1, 127, 200, 2**40])
def test_produce_batch_frame_equals_protoc(request_id: int) -> None:
    messages = [
        pb.Message(payload=_payload(size), properties=PROPS[i % len(PROPS)])
        for i, size in enumerate(SIZES)
    ]
    body = b"".join(
        encoding.encode_entry(m.payload, encoding.encode_properties(dict(m.properties)))
        for m in messages
    )
    expected_body = pb.MessageBatch(messages=messages).SerializeToString(deterministic=True)
    assert body == expected_body
    frame = encoding.produce_batch_frame(request_id, body)
    expected = pb.ProduceRequest(
        produce_batch=pb.ProduceBatchRequest(request_id=request_id, messages=expected_body)
    )
    assert frame == expected.SerializeToString(deterministic=True)
    parsed = pb.ProduceRequest.FromString(frame)
    assert parsed.WhichOneof("request") == "produce_batch"
    assert parsed.produce_batch.request_id == request_id
    assert list(pb.MessageBatch.FromString(parsed.produce_batch.messages).messages) == messages


@pytest.mark.parametrize(("request_id", "body"), [(0, b"x"), (5, b"")])
def test_default_fields_parse_the_same(request_id: int, body: bytes) -> None:
    """request_id 0 and an empty body are written explicitly where protoc omits them
    (the client never sends either); the frames still parse to the same request."""
    frame = encoding.produce_batch_frame(request_id, body)
    expected = pb.ProduceRequest(
        produce_batch=pb.ProduceBatchRequest(request_id=request_id, messages=body)
    )
    assert pb.ProduceRequest.FromString(frame) == expected


def test_close_frame_equals_protoc() -> None:
    assert (
        encoding.close_frame()
        == pb.ProduceRequest(close=pb.CloseProducerRequest()).SerializeToString()
    )


def test_message_properties_sets_reserved_keys_and_rejects_others() -> None:
    props = encoding.message_properties("p_v1", 401, {"a": "b"})
    assert props == {"a": "b", "_vc": "p_v1", "_t": "401"}
    assert encoding.message_properties(None, None, None) == {}
    with pytest.raises(ValueError, match="reserved"):
        encoding.message_properties(None, None, {"_tt": "1"})


@pytest.mark.parametrize(("sequence", "barrier"), [(0, 1), (3, 0), (9, 2**62 + 5)])
def test_produce_batch_frame_with_sequence_and_barrier_equals_protoc(
    sequence: int, barrier: int
) -> None:
    body = encoding.encode_entry(b"x")
    frame = encoding.produce_batch_frame(7, body, sequence, barrier)
    expected = pb.ProduceRequest(
        produce_batch=pb.ProduceBatchRequest(
            request_id=7, messages=body, sequence=sequence, barrier_time_tick=barrier
        )
    )
    assert frame == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    ("term", "commit", "offset", "sizes"),
    [
        (1, 0, 0, [1]),
        (3, 10**9, 2**40, [67_100]),
        (2**63 - 1, 2**64 - 1, 2**62, [300, 0, 16_384, 70_000]),
        (7, 5, 9, [0]),
    ],
)
def test_a_leaders_log_entry_equals_protoc(
    term: int, commit: int, offset: int, sizes: list[int]
) -> None:
    records = [_payload(size) for size in sizes]
    entry = protowire.log_entry(term, commit, offset, records)
    expected = pb.LogEntry(
        term=term,
        commit_offset=commit,
        offset=offset,
        record=records[0],
        next_records=records[1:],
    )
    assert entry == expected.SerializeToString(deterministic=True)


@pytest.mark.parametrize(("sequence", "barrier"), [(0, 0), (3, 0), (0, 1), (9, 2**62 + 5)])
def test_produce_batch_parts_are_the_frame_with_the_entries_uncopied(
    sequence: int, barrier: int
) -> None:
    entries = [encoding.encode_entry(_payload(size)) for size in SIZES]
    parts = encoding.produce_batch_parts(2**40, entries, sequence, barrier)
    frame = encoding.produce_batch_frame(2**40, b"".join(entries), sequence, barrier)
    assert b"".join(parts) == frame
    assert all(a is b for a, b in zip(parts[1:], entries, strict=False))


def test_a_payload_of_the_wrong_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"bytes, not str: encode it first, e\.g\. text\.encode"):
        encoding.encode_entry("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes, not int"):
        encoding.encode_entry(7)  # type: ignore[arg-type]
    assert encoding.encode_entry(bytearray(b"ok")) == encoding.encode_entry(b"ok")
    with pytest.raises(TypeError, match=r"bytes, not str: encode it first"):
        encoding.encode_entries([b"ok", "text"])  # type: ignore[list-item]
