"""Idempotent producers: a resent batch is answered with its original result, never
appended twice, also after the node was killed and restarted in between."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import grpc
import pytest

from streamwal.client import encoding
from streamwal.client.node_client import NodeClient, Producer
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import IgnoredOperation
from streamwal.ids import decode_offset
from streamwal.node.producers import (
    WINDOW,
    BatchResult,
    Duplicate,
    ProducerState,
    check_sequence,
    cut_producers,
    idle_producers,
    window_end,
)
from streamwal.proto import streaming_pb2 as pb
from tests.node.helpers import read_data

# -- pure ----------------------------------------------------------------------------------


def test_new_producer_may_start_anywhere_and_gaps_are_allowed() -> None:
    check_sequence(None, 57, "p")
    state = ProducerState()
    state.add(3, BatchResult(10, 100, 2))
    check_sequence(state, 5, "p")  # 4 was rejected by validation: not an error


def test_resent_sequences_are_answered_or_refused() -> None:
    state = ProducerState()
    for seq in range(1, WINDOW + 6):
        state.add(seq, BatchResult(seq * 10, seq * 100, 1))
    with pytest.raises(Duplicate) as dup:
        check_sequence(state, WINDOW + 5, "p")
    assert dup.value.result == BatchResult((WINDOW + 5) * 10, (WINDOW + 5) * 100, 1)
    with pytest.raises(IgnoredOperation, match="no longer kept"):
        check_sequence(state, 1, "p")  # fell out of the window
    assert len(state.results) == WINDOW


def test_window_persists_only_what_is_durable() -> None:
    state = ProducerState()
    for seq in (1, 2, 3):
        state.add(seq, BatchResult(seq, seq, 1))
    restored = ProducerState.decode(state.encode_upto(2))
    assert restored.accepted == 2 and list(restored.results) == [1, 2]


def test_the_persisted_window_follows_evictions_and_failed_writes() -> None:
    state = ProducerState()
    for seq in range(1, WINDOW + 9):
        state.add(seq, BatchResult(seq * 10, seq * 100, seq % 3 + 1))
    state.forget(WINDOW + 8)  # its write failed: the resend must be appended again
    restored = ProducerState.decode(state.encode_upto(WINDOW + 8))
    assert list(restored.results) == list(range(9, WINDOW + 8))
    assert restored.results == state.results and restored.accepted == WINDOW + 7
    check_sequence(state, WINDOW + 8, "p")  # no Duplicate: it is appended for real


def test_only_idle_producers_without_batches_in_flight_leave_memory() -> None:
    states: OrderedDict[str, ProducerState] = OrderedDict()
    for name, used in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 50.0), ("e", 4.0)):
        states[name] = ProducerState(last_used=used)  # "e" is out of order: not reached
    assert idle_producers(states, now=60.0, idle_s=30.0, busy={"b"}) == ["a", "c"]
    assert idle_producers(states, now=60.0, idle_s=100.0, busy=set()) == []


def test_retention_forgets_only_producers_it_cut_entirely() -> None:
    def window(*batches: tuple[int, int]) -> bytes:
        state = ProducerState()
        for seq, (base, count) in enumerate(batches, 1):
            state.add(seq, BatchResult(base, base, count))
        return state.encode_upto(len(batches))

    windows = [
        ("gone", window_end(window((0, 5), (5, 5)))),  # ends at 10
        ("straddles", window_end(window((5, 5), (95, 10)))),  # newest batch still in the log
        ("busy", window_end(window((0, 1)))),  # a batch in flight
        ("newer-in-memory", window_end(window((0, 1)))),  # appended since the window was read
    ]
    assert [end for _, end in windows] == [10, 105, 1, 1]
    held = {"newer-in-memory": ProducerState()}
    held["newer-in-memory"].add(2, BatchResult(200, 200, 1))
    assert cut_producers(windows, 100, held, busy={"busy"}) == ["gone"]
    assert cut_producers(windows, 10, {}, busy=set()) == ["gone", "busy", "newer-in-memory"]


# -- real node -----------------------------------------------------------------------------


class RawProducer:
    """A Produce stream that sends hand-numbered batches, to resend on purpose."""

    def __init__(self, address: str, pchannel: str, producer_id: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        header = pb.CreateProducerRequest(
            pchannel=pb.PChannelInfo(name=pchannel, term=1), producer_id=producer_id
        )
        method = self.channel.stream_stream(
            "/milvus.proto.streaming.StreamingNodeHandlerService/Produce",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ProduceResponse.FromString,
        )
        self.call = method(metadata=(("create-producer-bin", header.SerializeToString()),))
        self.rid = 0

    async def open(self) -> int:
        first = await self.call.read()
        return first.create.last_sequence

    async def send(self, sequence: int, payloads: list[bytes]) -> pb.ProduceBatchResult:
        self.rid += 1
        body = b"".join(encoding.encode_entry(p) for p in payloads)
        await self.call.write(encoding.produce_batch_frame(self.rid, body, sequence))
        resp = await asyncio.wait_for(self.call.read(), 10)
        assert resp.produce_batch.request_id == self.rid
        if resp.produce_batch.WhichOneof("response") == "error":
            raise AssertionError(resp.produce_batch.error)
        return resp.produce_batch.result

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


async def _payloads(address: str, pchannel: str) -> list[bytes]:
    async with NodeClient(address) as c:
        end = (await c.collect_status()).channels[0].next_offset
        consumer = await c.consumer(
            pchannel, 1, DeliverPolicy.all(), time_ticks=False, end_offset=end
        )
        got = [m.payload async for m in consumer]
        await consumer.close()
        return got


async def test_resend_is_answered_not_appended_across_a_kill(start_node, pchannel) -> None:
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
    raw = RawProducer(node.address, pchannel, "app-1")
    assert await raw.open() == 0
    first = await raw.send(1, [b"a", b"b"])
    second = await raw.send(2, [b"c"])
    again = await raw.send(2, [b"c"])  # the ack was "lost": the client resends
    assert again.duplicate and not second.duplicate
    assert again.first_id.id == second.first_id.id
    assert again.first_time_tick == second.first_time_tick
    await raw.close()

    node.kill()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
    raw = RawProducer(node.address, pchannel, "app-1")
    assert await raw.open() == 2  # the node remembers the producer across kill -9
    replay = await raw.send(1, [b"a", b"b"])
    assert replay.duplicate and replay.first_id.id == first.first_id.id
    third = await raw.send(3, [b"d"])
    assert not third.duplicate
    assert decode_offset(third.first_id.id) > decode_offset(second.first_id.id)
    await raw.close()
    assert await _payloads(node.address, pchannel) == [b"a", b"b", b"c", b"d"]


async def test_other_producers_are_not_deduplicated(client, pchannel) -> None:
    await client.assign(pchannel, 1)
    one = await client.producer(pchannel, 1, producer_id="one")
    two = await client.producer(pchannel, 1, producer_id="two")
    a = await one.send_many([b"x"])
    b = await two.send_many([b"x"])  # same sequence 1, other producer: appended
    assert a[0].offset != b[0].offset
    await one.close()
    await two.close()


async def test_resendable_producer_hands_pending_batches_to_a_new_stream(
    start_node, pchannel
) -> None:
    """The routing layer's primitive: a broken stream keeps its sends pending; a new
    producer with the same id adopts and resends them; nothing is lost or doubled."""
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        old = await c.producer(pchannel, 1, producer_id="router", resendable=True)
        sends = [asyncio.ensure_future(old.send_many([b"m%d" % i])) for i in range(200)]
        await asyncio.sleep(0)  # some are written, some queued
        node.pause()  # the stream stalls: nothing is acknowledged from here on
        await asyncio.sleep(0.2)
        await old.abandon()
        pending = old.detach_unacknowledged()
        assert pending, "expected unacknowledged batches"
        node.resume()
        new = await c.producer(pchannel, 1, producer_id="router", resendable=True)
        new.adopt(pending)
        results = await asyncio.wait_for(asyncio.gather(*sends), 20)
        await new.close()
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
        got = await read_data(consumer, 200)
        await consumer.close()
    assert sorted(m.payload for m in got) == sorted(b"m%d" % i for i in range(200))
    assert sorted(r[0].offset for r in results) == [m.offset for m in got]
    assert isinstance(new, Producer)


async def test_a_producer_may_opt_out_of_idempotence(start_node, pchannel) -> None:
    """`idempotent=False` (the peers' guarantee, for latency): its batches are appended
    and read like any other, the node keeps no window for it and the records name no
    producer, while an idempotent producer beside it still gets both."""
    from streamwal.node import records
    from streamwal.node.log_store import LogStore

    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        plain = await c.producer(pchannel, 1, idempotent=False)
        named = await c.producer(pchannel, 1, producer_id="named")
        assert plain.producer_id == ""
        await plain.send(b"p1")
        await plain.send_many([b"p2", b"p3"])
        await named.send(b"n1")
        with pytest.raises(ValueError, match="pinned sequence"):
            await plain.send_batch([encoding.encode_entry(b"x")], sequence=7)
        await plain.close()
        await named.close()
    assert await _payloads(node.address, pchannel) == [b"p1", b"p2", b"p3", b"n1"]
    node.kill()
    store = LogStore(node.data_dir, sync=False)
    try:
        assert [pid for pid, _ in store.producer_windows(pchannel)] == ["named"]
        stored = [records.decode(v) for _, v in store.records_from(pchannel, 0, 100)]
    finally:
        store.close()
    assert [r.producer for r in stored] == [None, None, ("named", 1)]


@pytest.mark.parametrize("options", [{"producer_id": "x"}, {"resendable": True}])
def test_naming_or_resending_needs_an_idempotent_producer(options: dict) -> None:
    with pytest.raises(ValueError, match="needs an idempotent producer"):
        Producer(None, "ch", 1, idempotent=False, **options)  # type: ignore[arg-type]
