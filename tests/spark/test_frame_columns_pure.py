"""frame_columns.decode against the protobuf classes: the same columns for every message
shape an encoder writes, and None (so the reader takes the protobuf path) for the valid
encodings it does not read."""

from __future__ import annotations

import random

import pytest

from streamwal.message import MsgType
from streamwal.proto import streaming_pb2 as pb
from streamwal.spark.frame_columns import FrameColumns, from_messages, split
from streamwal.spark.frame_columns import decode as decode_bodies


def columns(c: FrameColumns) -> dict[str, list]:
    return {
        "payload": c.payload.to_pylist(),
        "vchannel": c.vchannel.to_pylist(),
        "message_type": c.message_type.to_pylist(),
        # a map's order is not its meaning (protobuf maps have none)
        "properties": [dict(p) for p in c.properties.to_pylist()],
    }


def decode(serialized: bytes) -> FrameColumns | None:
    return decode_bodies(split(serialized))


def random_message(rng: random.Random) -> pb.Message:
    size = rng.choice([0, 1, 12, 13, 127, 128, 300, 20_000])
    props: dict[str, str] = {}
    for _ in range(rng.choice([0, 0, 1, 2, 5])):
        key = rng.choice(["k", "", "ключ", "_vc", "_t", "_tt", "_wt", "a-long-key-of-the-user"])
        props[key] = rng.choice(["", "v", "値", "x" * 200, "7"])
    if "_t" in props:
        props["_t"] = rng.choice(["", "1200", "5"])
    return pb.Message(payload=rng.randbytes(size), properties=props)


@pytest.mark.parametrize("seed", range(6))
def test_decoded_columns_equal_the_protobuf_ones(seed):
    rng = random.Random(seed)
    batch = pb.MessageBatch(messages=[random_message(rng) for _ in range(rng.choice([1, 7, 300]))])
    decoded = decode(batch.SerializeToString())
    assert decoded is not None
    assert columns(decoded) == columns(from_messages(batch.messages))


def test_an_empty_batch_and_messages_without_fields():
    assert columns(decode(b"")) == columns(from_messages([]))
    batch = pb.MessageBatch(messages=[pb.Message(), pb.Message(payload=b"p")])
    got = columns(decode(batch.SerializeToString()))
    assert got == {"payload": [b"", b"p"], "vchannel": [None, None],
                   "message_type": [int(MsgType.Insert)] * 2, "properties": [{}, {}]}  # fmt: skip


def entry(key: bytes, value: bytes) -> bytes:
    body = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(value)]) + value
    return b"\x12" + bytes([len(body)]) + body


def batch_of(*bodies: bytes) -> bytes:
    return b"".join(b"\x0a" + bytes([len(b)]) + b for b in bodies)


PAYLOAD = b"\x0a\x03abc"


@pytest.mark.parametrize(
    "body",
    [
        entry(b"k", b"v") + PAYLOAD,  # a property before the payload
        PAYLOAD + entry(b"k", b"1") + entry(b"k", b"2"),  # a key twice: the last one wins
        PAYLOAD + b"\x12\x06\x12\x01v\x0a\x01k",  # an entry's value before its key
        PAYLOAD + b"\x18\x05",  # an unknown varint field
        PAYLOAD + b"\x0a\x01z",  # the payload twice
    ],
)
def test_valid_encodings_in_another_layout_are_left_to_protobuf(body):
    serialized = batch_of(b"\x0a\x01x", body)
    parsed = pb.MessageBatch.FromString(serialized).messages  # valid protobuf all the same
    assert decode(serialized) is None
    assert len(from_messages(parsed).payload) == 2


def test_a_message_type_that_is_no_number_is_left_to_protobuf():
    serialized = batch_of(PAYLOAD + entry(b"_t", b"insert"))
    assert decode(serialized) is None
    with pytest.raises(ValueError):
        from_messages(pb.MessageBatch.FromString(serialized).messages)


def test_frames_read_together_give_the_rows_of_their_messages():
    """reader.Frames over batch frames of every shape (dense with tick runs, dense with
    one run, explicit offsets), one in a layout only protobuf reads, and a single-message
    frame: each row says what its ConsumedMessage says, in order."""
    from streamwal.client.consumed import ConsumedBatch, ConsumedMessage
    from streamwal.node import delivery
    from streamwal.spark.reader import Frames

    def body(*payloads: bytes, props: dict[str, str] | None = None) -> bytes:
        messages = [pb.Message(payload=p, properties=props or {}) for p in payloads]
        return pb.MessageBatch(messages=messages).SerializeToString()

    tagged = {"_vc": "v1", "_t": str(int(MsgType.Delete)), "k": "x"}
    dense = delivery.join(
        [delivery.Slice(10, 1000, body(b"a"), 1), delivery.Slice(11, 2000, body(b"b", b"c"), 2)]
    )
    one_run = delivery.Slice(13, 3000 << 18, body(b"d", b"e", props=tagged), 2)
    gap = delivery.join(
        [delivery.Slice(16, 4000, body(b"f"), 1), delivery.Slice(18, 5000, body(b"g"), 1)]
    )
    other_layout = delivery.Slice(19, 6000, batch_of(entry(b"k", b"v") + PAYLOAD), 1)
    frames = [ConsumedBatch(delivery.batch_frame(s, 4).consume_batch)
              for s in (dense, one_run, gap)]  # fmt: skip
    single = [ConsumedMessage(20, 5, 7000, pb.Message(payload=b"h"))]

    def rows(batches) -> list[tuple]:
        frames = Frames("p")
        for b in batches:
            frames.add(b)
        assert frames.count == sum(len(b) for b in batches)
        table = frames.rows().to_pylist()
        assert frames.count == 0
        return [(r["pchannel"], r["offset"], r["term"], r["time_tick"], r["payload"],
                 r["vchannel"], r["message_type"], dict(r["properties"]),
                 int(r["timestamp"].timestamp() * 1000)) for r in table]  # fmt: skip

    def expected(batches) -> list[tuple]:
        return [("p", m.offset, m.term, m.time_tick, m.payload, m.vchannel, m.msg_type,
                 {k: v for k, v in m.properties.items() if not k.startswith("_")},
                 m.time_tick >> 18) for b in batches for m in b]  # fmt: skip

    assert rows(frames) == expected(frames)  # decoded together
    assert [r[1] for r in rows(frames)] == [10, 11, 12, 13, 14, 16, 18]
    assert rows(frames[1:2])[0][5:9] == ("v1", int(MsgType.Delete), {"k": "x"}, 3000)
    mixed = [*frames, ConsumedBatch(delivery.batch_frame(other_layout, 4).consume_batch), single]
    assert rows(mixed) == expected(mixed)  # frame by frame
