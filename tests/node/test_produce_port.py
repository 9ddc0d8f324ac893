"""The produce port: producers reach the node over plain TCP frames, and gRPC stays whole.

The client picks the port up from Describe by itself; these tests check that it does,
that both transports are one log under the same rules (fencing, idempotence), that a
client falls back to gRPC whenever the port is off or gone, and that bad frames on the
port get clear errors while the node keeps serving (see also test_bad_input.py).
"""

from __future__ import annotations

import asyncio

import pytest

from streamwal import wire
from streamwal.client import encoding
from streamwal.client.node_client import NodeClient, replica_set
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import StreamingError, UnmatchedChannelTerm
from streamwal.ids import decode_offset
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import LocalNode
from tests.node.helpers import read_data


def _on_port(producer) -> bool:
    return producer.transport == "produce port"


async def test_producers_use_the_port_the_node_describes(node: LocalNode, client, pchannel) -> None:
    info = await client.describe()
    assert info.server_id == node.node_id and info.produce_port > 0
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    assert _on_port(producer)
    sent = [b"m%d" % i for i in range(50)]
    # and a batch of large messages, which goes out as its entries (a vectored write)
    sent += [bytes([i]) * 4096 + b"m%d" % i for i in range(8)]
    offsets = [(await producer.send(p)).offset for p in sent[:10]]
    offsets += [r.offset for r in await producer.send_many(sent[10:50])]
    offsets += [r.offset for r in await producer.send_many(sent[50:])]
    await producer.close()
    # in order, once each (an idle time tick may take an offset before or between sends)
    assert offsets == sorted(set(offsets)) and len(offsets) == 58
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    got = await read_data(consumer, 58)
    await consumer.close()
    assert [m.payload for m in got] == sent


async def test_both_transports_share_one_log_and_one_producer_identity(
    node: LocalNode, client, pchannel
) -> None:
    await client.assign(pchannel, 1)
    async with NodeClient(node.address, produce_port=False) as grpc_client:
        on_port = await client.producer(pchannel, 1, producer_id="writer")
        on_grpc = await grpc_client.producer(pchannel, 1, producer_id="writer")
        assert _on_port(on_port) and not _on_port(on_grpc)
        first = await on_port.send_batch([on_port.encode(b"a"), on_port.encode(b"b")], sequence=1)
        # The same batch resent over gRPC under the same producer id is answered, not
        # appended again: idempotence is the node's, not the transport's.
        again = await on_grpc.send_batch([on_grpc.encode(b"a"), on_grpc.encode(b"b")], sequence=1)
        assert again == first
        await on_grpc.send(b"c")
        await on_port.close()
        await on_grpc.close()
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    got = await read_data(consumer, 3)
    await consumer.close()
    assert [m.payload for m in got] == [b"a", b"b", b"c"]


async def test_stale_term_on_the_port_is_the_same_typed_error(client, pchannel) -> None:
    await client.assign(pchannel, 2)
    with pytest.raises(UnmatchedChannelTerm):
        await client.producer(pchannel, 1)
    producer = await client.producer(pchannel, 2)
    await client.assign(pchannel, 3)  # fences the open producer
    with pytest.raises(UnmatchedChannelTerm):
        await asyncio.wait_for(producer.send(b"late"), 10)
    await producer.abandon()


async def test_port_off_keeps_producers_on_grpc(start_node, pchannel) -> None:
    node = start_node("off", "--produce-listen", "off")
    async with NodeClient(node.address) as client:
        assert (await client.describe()).produce_port == 0
        await client.assign(pchannel, 1)
        producer = await client.producer(pchannel, 1)
        assert not _on_port(producer)
        await producer.send(b"x")
        await producer.close()


async def test_closing_the_client_ends_its_producers(node: LocalNode, pchannel) -> None:
    # A port producer has a connection of its own: closing only the client's gRPC
    # channel left it sending, and its send task pending once the loop was gone.
    client = NodeClient(node.address)
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    assert _on_port(producer)
    await producer.send(b"x")
    await client.close()
    with pytest.raises(StreamingError):
        await producer.send(b"after the client closed")


async def test_client_can_keep_producers_on_grpc(
    node: LocalNode, pchannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMWAL_PRODUCE_PORT", "off")
    async with NodeClient(node.address) as client:
        await client.assign(pchannel, 1)
        producer = await client.producer(pchannel, 1)
        assert not _on_port(producer)
        await producer.send(b"x")
        await producer.close()


async def test_a_restarted_node_on_a_new_port_is_found_again(node: LocalNode, pchannel) -> None:
    async with NodeClient(node.address) as client:
        await client.assign(pchannel, 1)
        producer = await client.producer(pchannel, 1)
        before = await producer.send(b"before")
        old_port = (await client.describe()).produce_port
        node.kill()
        node.start(timeout=60)
        await client.wait_ready(30)
        await client.assign(pchannel, 1)  # a restarted node waits to be assigned again
        assert (await client.describe()).produce_port != old_port
        await producer.abandon()
        # The cached port is gone: this producer falls back to gRPC and forgets it ...
        fallback = await client.producer(pchannel, 1)
        assert (await fallback.send(b"after")).offset > before.offset
        await fallback.close()
        # ... and the next one asks the node again and is back on the port.
        again = await client.producer(pchannel, 1)
        assert _on_port(again)
        await again.close()


async def test_a_stale_port_now_held_by_another_node_is_not_taken_for_an_answer(
    start_node, pchannel
) -> None:
    """After a restart on a new port, the old number may belong to another node; its
    refusal (it does not serve the pchannel) must not fail the producer."""
    a = start_node("a", node_id=1)
    b = start_node("b", node_id=2)
    async with NodeClient(a.address) as client, NodeClient(b.address) as other:
        await client.assign(pchannel, 1)
        client._produce_port = (await other.describe()).produce_port  # what a stale cache holds
        producer = await client.producer(pchannel, 1)
        assert _on_port(producer)
        sent = await producer.send(b"to a")
        await producer.close()
        consumer = await client.consumer(pchannel, 1, DeliverPolicy.start_from(sent.offset))
        assert [m.payload for m in await read_data(consumer, 1)] == [b"to a"]
        await consumer.close()
        assert client._produce_port == (await client.describe()).produce_port
        # A refusal by the node itself is still the caller's answer.
        with pytest.raises(UnmatchedChannelTerm):
            await client.producer(pchannel, 7)


async def _raw_port_stream(client: NodeClient, pchannel: str, requests: list[bytes], pause: float):
    """A producer speaking the port's frames by hand: header, `requests`, close, each
    frame written at once; reads nothing for `pause` seconds, then every answer."""
    info = await client.describe()
    reader, writer = await asyncio.open_connection("127.0.0.1", info.produce_port, limit=1 << 26)
    header = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=pchannel, term=1))
    try:
        writer.write(wire.frame(wire.CREATE_PRODUCER, header.SerializeToString()))
        for r in [*requests, encoding.close_frame()]:
            writer.write(wire.frame(wire.PRODUCE_REQUEST, r))
        await writer.drain()
        await asyncio.sleep(pause)
        answers = []
        while (got := await asyncio.wait_for(wire.read_frame(reader, 1 << 26), 10)) is not None:
            kind, body = got
            assert kind == wire.PRODUCE_RESPONSE, got
            answers.append(pb.ProduceResponse.FromString(body))
    finally:
        writer.close()
    return answers


@pytest.mark.parametrize("payload_bytes, pause", [(16, 0.0), (64 * 1024, 0.5)])
async def test_every_request_is_answered_once_and_the_close_last(
    client, pchannel, payload_bytes: int, pause: float
) -> None:
    """An answer leaves straight from the callback of the write that made it durable, or
    through the stream's writer task once something is queued before it (the close
    request, read here long before 32 MiB of appends are durable). Either way each
    request gets exactly one answer, and the close answer comes after all of them."""
    await client.assign(pchannel, 1)
    body = b"x" * payload_bytes
    count = 500
    requests = [
        encoding.produce_batch_frame(rid, encoding.encode_entry(body), rid, 0)
        for rid in range(1, count + 1)
    ]
    answers = await _raw_port_stream(client, pchannel, requests, pause)
    kinds = [a.WhichOneof("response") for a in answers]
    assert kinds == ["create"] + ["produce_batch"] * count + ["close"]
    results = sorted(
        (a.produce_batch.request_id, a.produce_batch.result.first_id.id) for a in answers[1:-1]
    )
    assert [rid for rid, _ in results] == list(range(1, count + 1))
    offsets = [decode_offset(raw) for _, raw in results]
    assert offsets == sorted(set(offsets))  # appended in request order, once each


async def test_a_producer_past_its_window_is_held_back_by_tcp_not_buffered(
    start_node, pchannel
) -> None:
    """While no ack can come (the only follower of a quorum pchannel is down), the node
    takes no more of a producer's stream than its window and one read's worth, and the
    rest of what the producer offered waits on the producer's side of the socket."""
    node = start_node("n1", "--producer-window", "256KiB")
    async with NodeClient(node.address) as client:
        members = [(node.node_id, node.address), (2, "127.0.0.1:9")]
        await client.assign(pchannel, 1, replica_set=replica_set(True, members))
        info = await client.describe()
        reader, writer = await asyncio.open_connection("127.0.0.1", info.produce_port)
        header = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=pchannel, term=1))
        try:
            writer.write(wire.frame(wire.CREATE_PRODUCER, header.SerializeToString()))
            kind, _ = await asyncio.wait_for(wire.read_frame(reader), 10)
            assert kind == wire.PRODUCE_RESPONSE
            entry = encoding.encode_entry(b"x" * 64 * 1024)
            for rid in range(1, 641):  # 40 MiB, written without waiting
                request = encoding.produce_batch_frame(rid, entry, 0, 0)
                writer.write(wire.frame(wire.PRODUCE_REQUEST, request))
            await asyncio.sleep(1.5)
            status = await client.collect_status()
            taken = {c.pchannel.name: c.next_offset for c in status.channels}[pchannel]
            # 4 batches fill the window; idle time ticks may take a few offsets too
            assert 4 <= taken <= 40
            assert writer.transport.get_write_buffer_size() > 20 * 1024 * 1024
        finally:
            writer.close()
