"""Bad input gets a clear error, and the node keeps serving everyone else, losing nothing.

Each test runs a bystander (a producer and a consumer on another pchannel) for its whole
length; at teardown the bystander must have had every batch acknowledged and consumed, in
order, and the node must still answer.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from grpc import aio

from streamwal import wire
from streamwal.client import encoding
from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.errors import (
    ChannelFenced,
    Code,
    InvalidArgument,
    ResourceExhausted,
    StreamingError,
)
from streamwal.grpc_errors import from_trailing
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import LocalNode
from streamwal.transport import make_channel
from tests.node.helpers import HANDLER, RawProducer, read_data, read_log

MANAGER = "/milvus.proto.streaming.StreamingNodeManagerService/"
MIB = 1024 * 1024


def _raw_stream(address: str, method: str, metadata=()) -> tuple[aio.Channel, aio.StreamStreamCall]:
    channel = make_channel(address)
    call = channel.stream_stream(
        HANDLER + method, request_serializer=None, response_deserializer=None
    )(metadata=metadata)
    return channel, call


async def _status(call) -> tuple[grpc.StatusCode, str, object]:
    """Reads until the call ends; its status, details and StreamingError (if any)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        for _ in range(1000):
            if await asyncio.wait_for(call.read(), 10) is aio.EOF:
                break
    code = await call.code()
    return code, await call.details(), from_trailing(await call.trailing_metadata())


def _producer_header(pch: str, term: int = 1) -> tuple[tuple[str, bytes]]:
    return (
        (
            "create-producer-bin",
            pb.CreateProducerRequest(
                pchannel=pb.PChannelInfo(name=pch, term=term)
            ).SerializeToString(),
        ),
    )


def _consumer_header(pch: str, term: int = 1, **kw) -> tuple[tuple[str, bytes]]:
    req = pb.CreateConsumerRequest(pchannel=pb.PChannelInfo(name=pch, term=term), **kw)
    return (("create-consumer-bin", req.SerializeToString()),)


async def _ready_producer(address: str, pch: str):
    channel, call = _raw_stream(address, "Produce", _producer_header(pch))
    first = pb.ProduceResponse.FromString(await asyncio.wait_for(call.read(), 10))
    assert first.WhichOneof("response") == "create"
    return channel, call


# -- frames and headers ------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x12\x80", b"R\x05\x08"])
async def test_malformed_produce_frame(
    node: LocalNode, client, bystander, pchannel, garbage
) -> None:
    await client.assign(pchannel, 1)
    channel, call = await _ready_producer(node.address, pchannel)
    await call.write(garbage)
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ProduceRequest frame" in details
    assert isinstance(err, InvalidArgument)


async def test_malformed_consume_frame(node: LocalNode, client, bystander, pchannel) -> None:
    await client.assign(pchannel, 1)
    channel, call = _raw_stream(node.address, "Consume", _consumer_header(pchannel))
    await asyncio.wait_for(call.read(), 10)  # create
    await call.write(b"\xff\xff\xff")
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ConsumeRequest frame" in details and isinstance(err, InvalidArgument)


async def test_empty_consume_request(node: LocalNode, client, bystander, pchannel) -> None:
    await client.assign(pchannel, 1)
    channel, call = _raw_stream(node.address, "Consume", _consumer_header(pchannel))
    await asyncio.wait_for(call.read(), 10)
    await call.write(b"")
    code, details, _ = await _status(call)
    await channel.close()
    assert (code, "empty ConsumeRequest" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)


@pytest.mark.parametrize("method", ["Produce", "Consume"])
async def test_missing_header(node: LocalNode, bystander, method) -> None:
    channel, call = _raw_stream(node.address, method)
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    key = "create-producer-bin" if method == "Produce" else "create-consumer-bin"
    assert f"missing {key} header" in details
    assert isinstance(err, InvalidArgument)


@pytest.mark.parametrize("method", ["Produce", "Consume"])
async def test_garbled_header(node: LocalNode, bystander, method) -> None:
    key = "create-producer-bin" if method == "Produce" else "create-consumer-bin"
    channel, call = _raw_stream(node.address, method, ((key, b"\x0a\xff\xff\xff\xff"),))
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"garbled {key} header" in details and isinstance(err, InvalidArgument)


async def test_malformed_unary_request(node: LocalNode, bystander) -> None:
    channel = make_channel(f"{node.host}:{node.internal_port}")
    call = channel.unary_unary(
        MANAGER + "Assign", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"\xff\xff\xff")
    await channel.close()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed StreamingNodeManagerAssignRequest" in info.value.details()


# -- produce requests --------------------------------------------------------------------


async def test_bad_requests_on_one_stream_get_errors_and_the_stream_goes_on(
    node: LocalNode, client, bystander, pchannel
) -> None:
    """Per-request errors (empty batch, malformed batch, oversized) answer that request only."""
    await client.assign(pchannel, 1)
    channel, call = await _ready_producer(node.address, pchannel)
    big = encoding.encode_entry(b"x" * (4 * MIB + 1))
    ok1 = encoding.encode_entry(b"good-1")
    ok2 = encoding.encode_entry(b"good-2")
    frames = {
        1: encoding.produce_batch_frame(1, ok1),
        2: encoding.produce_batch_frame(2, b""),  # empty batch
        3: encoding.produce_batch_frame(3, b"\x0a\xff\xff"),  # malformed MessageBatch
        4: encoding.produce_batch_frame(4, ok1 + big),  # one message over 4 MiB
        5: pb.ProduceRequest(
            produce=pb.ProduceMessageRequest(
                request_id=5, message=pb.Message(payload=b"y" * (4 * MIB + 1))
            )
        ).SerializeToString(),
        6: encoding.produce_batch_frame(6, ok2),
    }
    for frame in frames.values():
        await call.write(frame)
    answers = {}
    for _ in frames:
        resp = pb.ProduceResponse.FromString(await asyncio.wait_for(call.read(), 20))
        kind = resp.WhichOneof("response")
        r = getattr(resp, kind)
        answers[r.request_id] = r
    await call.write(encoding.close_frame())
    closing = pb.ProduceResponse.FromString(await asyncio.wait_for(call.read(), 10))
    assert closing.WhichOneof("response") == "close"
    await channel.close()

    assert answers[1].WhichOneof("response") == "result"
    assert answers[6].WhichOneof("response") == "result"
    expected = {
        2: "empty batch",
        3: "malformed MessageBatch",
        4: "message 1 of the batch is",
        5: "over the 4194304-byte limit",
    }
    for rid, text in expected.items():
        assert answers[rid].WhichOneof("response") == "error", rid
        assert answers[rid].error.code == Code.STREAMING_CODE_INVAILD_ARGUMENT, rid
        assert text in answers[rid].error.cause, (rid, answers[rid].error.cause)
    # Only the good messages are in the log, nothing of the rejected ones.
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all())
    got = await read_data(consumer, 2)
    assert [m.payload for m in got] == [b"good-1", b"good-2"]
    producer = await client.producer(pchannel, 1)
    marker = await producer.send(b"marker")
    after = await read_data(consumer, 1)
    assert after[0].offset == marker.offset and after[0].payload == b"marker"
    await consumer.close()
    await producer.close()


async def test_empty_produce_request_ends_the_stream(
    node: LocalNode, client, bystander, pchannel
) -> None:
    await client.assign(pchannel, 1)
    channel, call = await _ready_producer(node.address, pchannel)
    await call.write(b"")
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "empty ProduceRequest" in details
    assert isinstance(err, InvalidArgument)


async def test_messages_at_the_default_limit_are_accepted(client, bystander, pchannel) -> None:
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    r = await producer.send(b"z" * (4 * MIB - 16))
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all())
    got = await read_data(consumer, 1)
    assert got[0].offset == r.offset and len(got[0].payload) == 4 * MIB - 16
    await consumer.close()
    await producer.close()


async def test_configured_message_limit(start_node, pchannel) -> None:
    node = start_node("small", "--max-message-size", "1KiB")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        ok = await producer.send(b"a" * 1000)
        with pytest.raises(InvalidArgument, match="over the 1024-byte limit"):
            await producer.send_many([b"b" * 10, b"c" * 1100])
        # A producer whose batch was rejected is not broken; the batch left no trace.
        ok2 = await producer.send_many([b"d" * 1000, b"e" * 1000])
        assert ok2[0].offset == ok.offset + 1
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.all())
        got = await read_data(consumer, 3)
        assert [m.payload[:1] for m in got] == [b"a", b"d", b"e"]
        await consumer.close()
        await producer.close()


# -- consumer headers and names ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        (
            {"deliver_policy": pb.DeliverPolicy(start_from=pb.MessageID(id=b"\x01\x02"))},
            "bad MessageID",
        ),
        ({"deliver_policy": DeliverPolicy.start_from(10**6).to_proto()}, "past the end of the log"),
        (
            {"deliver_filters": [DeliverFilter.vchannel(v).to_proto() for v in ("a", "b")]},
            "at most one vchannel",
        ),
        ({"deliver_filters": [pb.DeliverFilter()]}, "empty DeliverFilter"),
    ],
    ids=["bad-id", "past-end", "two-vchannels", "empty-filter"],
)
async def test_bad_consumer_headers(node: LocalNode, client, bystander, pchannel, kw, text) -> None:
    await client.assign(pchannel, 1)
    channel, call = _raw_stream(node.address, "Consume", _consumer_header(pchannel, **kw))
    code, details, err = await _status(call)
    await channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details
    assert isinstance(err, InvalidArgument)


@pytest.mark.parametrize(
    "name",
    ["", "a\0b", "x" * 201, "bad\nname", "tab\tname"],
    ids=["empty", "nul", "long", "newline", "tab"],
)
async def test_invalid_pchannel_names(client, bystander, name) -> None:
    with pytest.raises(InvalidArgument, match="invalid pchannel name"):
        await client.assign(name, 1)
    status = await client.collect_status()
    assert name not in [s.pchannel.name for s in status.channels]


async def test_unusual_but_valid_names_work(client, bystander) -> None:
    for name in ("ünïcode-名前", "a" * 200, "by"):  # "by" is a prefix of the bystander's name
        await client.assign(name, 1)
        producer = await client.producer(name, 1)
        r = await producer.send(name.encode())
        consumer = await client.consumer(name, 1, DeliverPolicy.all())
        got = await read_data(consumer, 1)
        assert (got[0].offset, got[0].payload) == (r.offset, name.encode())
        await consumer.close()
        await producer.close()


async def test_negative_retention_is_invalid(client, bystander, pchannel) -> None:
    with pytest.raises(InvalidArgument, match="retention bounds must be >= 0"):
        await client.assign(pchannel, 1, retention_bytes=-1)
    with pytest.raises(InvalidArgument, match="retention bounds must be >= 0"):
        await client.assign(pchannel, 1, retention_age_ms=-5)


async def test_spoofed_node_properties_are_overwritten_on_delivery(
    node: LocalNode, client, bystander, pchannel
) -> None:
    """`_tt` and `_wt` are the node's: a producer's values never reach a consumer."""
    from tests.node.helpers import RawConsumer, RawProducer

    await client.assign(pchannel, 2)
    raw = RawProducer(node.address, pchannel, 2)
    await raw.open()
    resp = await raw.send(b"spoof", {"_tt": "5", "_wt": "99", "user": "u"})
    await raw.close()
    tick = resp.result.time_tick
    seed = RawConsumer(node.address, pchannel, 2, DeliverPolicy.all())
    await seed.open()
    (m,) = await seed.data(1)
    await seed.close()
    assert (m.properties["_tt"], m.properties["_wt"], m.properties["user"]) == (str(tick), "2", "u")
    consumer = await client.consumer(pchannel, 2, DeliverPolicy.all())
    (b,) = await read_data(consumer, 1)
    await consumer.close()
    assert (b.properties["_tt"], b.properties["_wt"], b.time_tick, b.term) == (
        str(tick),
        "2",
        tick,
        2,
    )


# -- the produce port (plain TCP frames, proto/wire.proto) --------------------------------


async def _port_exchange(
    client: NodeClient, data: bytes, close_write: bool = False, port: str = "produce_port"
):
    """Send raw bytes to the produce port (or `port`, another field of Describe); every
    frame that comes back until it closes."""
    info = await client.describe()
    reader, writer = await asyncio.open_connection("127.0.0.1", getattr(info, port))
    frames = []
    try:
        writer.write(data)
        if close_write:
            writer.write_eof()
        while (got := await asyncio.wait_for(wire.read_frame(reader), 10)) is not None:
            frames.append(got)
    finally:
        writer.close()
    return frames


def _port_error(frames) -> StreamingError:
    kind, body = frames[-1]
    assert kind == wire.ERROR, frames
    return StreamingError.from_proto(pb.StreamingError.FromString(body))


def _port_header(pch: str, term: int = 1) -> bytes:
    req = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=pch, term=term))
    return wire.frame(wire.CREATE_PRODUCER, req.SerializeToString())


@pytest.mark.parametrize(
    "data, error, text",
    [
        (b"\x00\x00\x00\x02\x63ab", InvalidArgument, "unknown frame kind 99"),
        (b"\xff\xff\xff\xff\x01", ResourceExhausted, "over the limit (--max-frame-size)"),
        (
            wire.frame(wire.PRODUCE_REQUEST, b""),
            InvalidArgument,
            "the first frame must be CREATE_PRODUCER",
        ),
        (
            wire.frame(wire.CREATE_PRODUCER, b"\xff\xff\xff"),
            InvalidArgument,
            "garbled CreateProducerRequest",
        ),
    ],
)
async def test_bad_frames_on_the_produce_port(client, bystander, data, error, text) -> None:
    err = _port_error(await _port_exchange(client, data))
    assert isinstance(err, error) and text in str(err)


def _ack_frame(ack: pb.ReplicaAck) -> bytes:
    return wire.frame(wire.REPLICA_ACK, ack.SerializeToString())


@pytest.mark.parametrize(
    "data, error, text",
    [
        (b"\xff\xff\xff\xff\x05", ResourceExhausted, "over the limit (--max-frame-size)"),
        (b"\x00\x00\x00\x02\x63ab", InvalidArgument, "unknown frame kind 99"),
        (wire.frame(wire.LOG_ENTRY, b""), InvalidArgument, "frame kind 6 on the replication"),
        (wire.frame(wire.REPLICA_ACK, b"\xff\xff\xff"), InvalidArgument, "garbled ReplicaAck"),
        (_ack_frame(pb.ReplicaAck(pchannel="nowhere", term=1)), ChannelFenced, "not led"),
        (_ack_frame(pb.ReplicaAck(pchannel="x", term=-1)), InvalidArgument, "term"),
    ],
)
async def test_bad_frames_on_the_replication_port(client, bystander, data, error, text) -> None:
    """Each gets the StreamingError a gRPC Replicate stream would end with, as an ERROR
    frame, and the node keeps serving (the bystander's calls go on throughout)."""
    err = _port_error(await _port_exchange(client, data, port="replication_port"))
    assert isinstance(err, error) and text in str(err)


async def test_a_malformed_request_on_the_produce_port_ends_only_its_stream(
    client, bystander, pchannel
) -> None:
    await client.assign(pchannel, 1)
    good = encoding.produce_batch_frame(1, encoding.encode_entry(b"ok"), 0, 0)
    frames = await _port_exchange(
        client,
        _port_header(pchannel)
        + wire.frame(wire.PRODUCE_REQUEST, good)
        + wire.frame(wire.PRODUCE_REQUEST, b"\xff\xff\xff\xff"),
    )
    answers = [pb.ProduceResponse.FromString(b) for k, b in frames[:-1]]
    assert [a.WhichOneof("response") for a in answers] == ["create", "produce_batch"]
    assert answers[1].produce_batch.result.count == 1  # acked before the bad frame: kept
    err = _port_error(frames)
    assert isinstance(err, InvalidArgument) and "malformed ProduceRequest" in str(err)
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    assert [m.payload for m in await read_data(consumer, 1)] == [b"ok"]
    await consumer.close()


async def test_a_frame_cut_short_on_the_produce_port_appends_nothing(
    client, bystander, pchannel
) -> None:
    await client.assign(pchannel, 1)
    whole = wire.frame(
        wire.PRODUCE_REQUEST,
        encoding.produce_batch_frame(1, encoding.encode_entry(b"half"), 0, 0),
    )
    frames = await _port_exchange(client, _port_header(pchannel) + whole[:-3], close_write=True)
    assert _port_error(frames).code == Code.STREAMING_CODE_INVAILD_ARGUMENT
    status = await client.collect_status()
    assert {c.pchannel.name: c.next_offset for c in status.channels}[pchannel] == 0


async def test_a_stale_term_on_the_produce_port_is_refused(client, bystander, pchannel) -> None:
    await client.assign(pchannel, 2)
    err = _port_error(await _port_exchange(client, _port_header(pchannel, 1)))
    assert err.code == Code.STREAMING_CODE_UNMATCHED_CHANNEL_TERM and "stale" in str(err)


# -- issue 23: what one request could do to a node, and gets now -----------------------------


async def test_an_assign_past_the_offset_range_is_refused_and_stops_nothing(
    client, bystander, pchannel
) -> None:
    """An Assign with min_next_offset 2^64-1 used to be taken; the pchannel's next time
    tick then overflowed the record key and stopped every write of the node."""
    for bad in (2**64 - 1, 2**62 + 1):
        with pytest.raises(
            InvalidArgument, match=r"min_next_offset must be 0\.\.4611686018427387904"
        ):
            await client.assign(pchannel, 1, min_next_offset=bad)
    status = await client.collect_status()
    assert pchannel not in [s.pchannel.name for s in status.channels]
    await client.assign(pchannel, 1, min_next_offset=2**62)  # the largest start allowed
    # A reader that takes ticks: the idle tick of the new pchannel is written meanwhile.
    reader = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=True)
    tick = await asyncio.wait_for(reader.__anext__(), 10)
    assert tick.offset == 2**62
    await reader.close()
    producer = await client.producer(pchannel, 1)
    first = await asyncio.wait_for(producer.send(b"high"), 10)
    assert first.offset > 2**62
    await producer.close()


async def _refused_type(node: LocalNode, client: NodeClient, pchannel: str) -> list[str]:
    """`_t = "abc"` sent every way a producer can: each refused, naming the property."""
    causes = []
    raw = RawProducer(node.address, pchannel, 1)  # the seed's per-message produce (gRPC)
    await raw.open()
    resp = await raw.send(b"poison", {"_t": "abc"})
    causes.append(resp.error.cause)
    await raw.close()
    async with NodeClient(node.address, produce_port=False) as grpc_client:
        for c in (client, grpc_client):  # batches, on either transport
            causes += await _refused_batch_and_txn(c, pchannel)
    return causes


async def _refused_batch_and_txn(client: NodeClient, pchannel: str) -> list[str]:
    producer = await client.producer(pchannel, 1)
    transport = producer.transport
    entry = encoding.encode_entry(b"poison", encoding.encode_properties({"_t": "abc"}))
    with pytest.raises(InvalidArgument) as batch:
        await producer.send_batch([encoding.encode_entry(b"fine"), entry])
    txn = await producer.begin_txn(f"{pchannel}_v0")
    with pytest.raises(InvalidArgument) as append:
        await txn.append(b"poison", properties={"_t": "12345678901"})
    await txn.rollback()
    await producer.close()
    return [f"{transport}: {batch.value}", f"{transport}: {append.value}"]


async def test_a_reserved_property_with_a_bad_value_never_reaches_the_log(
    node: LocalNode, client, bystander, pchannel
) -> None:
    """A raw Produce with `_t = "abc"` used to be acknowledged; every reader (the CLI
    consume, the Spark source) then crashed at its offset, forever."""
    await client.assign(pchannel, 1)
    causes = await _refused_type(node, client, pchannel)
    assert [c.split(":")[0] for c in causes[1:]] == ["produce port"] * 2 + ["gRPC"] * 2
    abc, long = [causes[0], causes[1], causes[3]], [causes[2], causes[4]]
    assert all("property _t is 'abc', not a message type code" in c for c in abc), causes
    assert all("message 1: property" in c for c in abc[1:]), causes  # the batch's 2nd
    assert all("property _t is '12345678901'" in c for c in long), causes
    raw = RawProducer(node.address, pchannel, 1)
    await raw.open()
    good = await raw.send_ok(b"typed", {"_t": "401", "_bid": "other reserved keys pass"})
    await raw.close()
    got = await read_log(client, pchannel, 1)
    assert [(m.offset, m.payload, m.msg_type) for m in got] == [(good, b"typed", 401)]
    assert got[0].properties["_bid"] == "other reserved keys pass"


def test_a_bad_stored_type_is_a_clear_error_for_a_reader() -> None:
    """A `_t` stored before the node checked it: the reader says so instead of crashing."""
    from streamwal.client.consumed import ConsumedMessage

    bad = ConsumedMessage(7, 1, 100, pb.Message(properties={"_t": "abc"}))
    with pytest.raises(InvalidArgument, match="message at offset 7: property _t is 'abc'"):
        _ = bad.msg_type
    assert ConsumedMessage(8, 1, 101, pb.Message(properties={"_t": ""})).msg_type == 400


async def test_a_huge_txn_keepalive_is_refused_and_the_stream_goes_on(client, pchannel) -> None:
    """A keepalive of 2^64-1 used to end the stream with OK and no answer."""
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    producer = await client.producer(pchannel, 1)
    huge = pb.TxnRequest(begin=pb.TxnBegin(vchannel=vch, keepalive_ms=2**64 - 1))
    with pytest.raises(InvalidArgument, match="keepalive_ms 18446744073709551615 is over"):
        await producer.txn_request(huge)
    txn = await producer.begin_txn(vch)  # the stream is still served
    await txn.append(b"t")
    assert (await txn.commit()).count == 1
    await producer.close()


async def test_one_stream_cannot_take_every_txn_of_the_node(start_node, pchannel) -> None:
    """One stream opening 1,023 txns used to leave every other caller INTERNAL errors: a
    stream holds 64 at most (--txn-max-open-per-stream), and over the node's limit a
    begin is RESOURCE_EXHAUSTED naming it."""
    node = start_node("n1", "--txn-max-open", "70")
    vch = f"{pchannel}_v0"
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        greedy = await c.producer(pchannel, 1)
        txns = []
        with pytest.raises(StreamingError) as info:
            while len(txns) < 70:
                txns.append(await greedy.begin_txn(vch))
        assert len(txns) == 64
        assert isinstance(info.value, ResourceExhausted), info.value
        assert "the limit per stream" in str(info.value)
        assert "(--txn-max-open-per-stream)" in str(info.value)
        other = await c.producer(pchannel, 1)
        mine = [await other.begin_txn(vch) for _ in range(6)]
        with pytest.raises(ResourceExhausted, match=r"holds 70 open txns, its limit.*max-open\)"):
            await other.begin_txn(vch)
        await txns[0].append(b"t")
        assert (await txns[0].commit()).count == 1
        await mine[0].append(b"m")
        assert (await mine[0].commit()).count == 1
        await greedy.close()
        await other.close()
