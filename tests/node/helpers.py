"""Helpers shared by the node tests: bounded reads, seed-style raw streams, batch payloads.

Everything that waits is bounded by a timeout so a broken node fails a test instead of
hanging the suite. Time ticks (type 1200) are appended by the node on idle pchannels
while a consumer takes them, and are skipped wherever the tests count data.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc import aio
from prometheus_client.parser import text_string_to_metric_families

from streamwal.client.node_client import ConsumedMessage, Consumer, NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.grpc_errors import from_rpc_error
from streamwal.ids import decode_offset
from streamwal.message import PROP_TERM, PROP_TIME_TICK, PROP_TYPE, MsgType
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import make_channel
from tests.support import wait_for

TICK_TYPE = str(int(MsgType.TimeTick))
HANDLER = "/milvus.proto.streaming.StreamingNodeHandlerService/"
_TAG = struct.Struct(">IIQ")  # batch id, index in batch, a fixed magic for sanity
_MAGIC = 0x5EED_0F_BA7C4


def is_tick(msg: ConsumedMessage) -> bool:
    return msg.msg_type == MsgType.TimeTick


def tagged(batch_id: int, index: int, pad: int = 0) -> bytes:
    """A payload that says which batch and position it came from."""
    return _TAG.pack(batch_id, index, _MAGIC) + b"p" * pad


def untag(payload: bytes) -> tuple[int, int]:
    batch_id, index, magic = _TAG.unpack_from(payload)
    assert magic == _MAGIC, f"payload {payload[:24]!r} is not a tagged test payload"
    return batch_id, index


async def read_data(consumer: Consumer, count: int, timeout: float = 10.0) -> list[ConsumedMessage]:
    """The next `count` non-tick messages; fails if they do not arrive within `timeout`."""
    out: list[ConsumedMessage] = []

    async def run() -> None:
        async for msg in consumer:
            if not is_tick(msg):
                out.append(msg)
                if len(out) >= count:
                    return
        raise AssertionError(f"consumer ended after {len(out)} of {count} messages")

    try:
        await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(f"only {len(out)} of {count} messages within {timeout}s") from None
    return out


async def read_log(c: NodeClient, pch: str, term: int) -> list[ConsumedMessage]:
    """Every data message in the log now (a bounded read up to the log end, no ticks)."""
    end = next(s for s in (await c.collect_status()).channels if s.pchannel.name == pch)
    consumer = await c.consumer(
        pch, term, DeliverPolicy.all(), time_ticks=False, end_offset=end.next_offset
    )
    got = [m async for m in consumer]
    await consumer.close()
    return got


async def read_through(
    consumer: Consumer, last_offset: int, timeout: float = 10.0
) -> list[ConsumedMessage]:
    """Every message (ticks included) up to and including offset `last_offset`."""
    out: list[ConsumedMessage] = []

    async def run() -> None:
        async for msg in consumer:
            out.append(msg)
            if msg.offset >= last_offset:
                return
        raise AssertionError(f"consumer ended at {out[-1].offset if out else None}")

    try:
        await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(
            f"did not reach offset {last_offset} within {timeout}s "
            f"(last {out[-1].offset if out else None})"
        ) from None
    return out


async def expect_nothing(consumer: Consumer, seconds: float) -> None:
    """Asserts that no data message (only ticks) arrives for `seconds`."""
    try:
        msgs = await read_data(consumer, 1, seconds)
    except AssertionError:
        return
    raise AssertionError(f"unexpected message {msgs[0]!r}")


class Bystander:
    """Produces a batch every few milliseconds and reads it back, on its own pchannel:
    whatever a test does to the node, this caller must be served throughout (the
    `bystander` fixture checks it at teardown)."""

    def __init__(self, client: NodeClient, pchannel: str = "bystander") -> None:
        self.client = client
        self.pchannel = pchannel
        self.acked: list[bytes] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.client.assign(self.pchannel, 1)
        producer = await self.client.producer(self.pchannel, 1)
        i = 0
        while not self.stop.is_set() and i < 2000:
            payloads = [b"by%d.%d" % (i, k) for k in range(5)]
            await asyncio.wait_for(producer.send_many(payloads), 10)
            self.acked += payloads
            i += 1
            await asyncio.sleep(0.01)
        await producer.close()

    async def verify(self) -> None:
        consumer = await self.client.consumer(self.pchannel, 1, DeliverPolicy.all())
        got = await read_data(consumer, len(self.acked), timeout=30)
        await consumer.close()
        assert [m.payload for m in got] == self.acked


@contextlib.asynccontextmanager
async def served_throughout(
    client: NodeClient, pchannel: str = "bystander"
) -> AsyncIterator[Bystander]:
    """A Bystander on `client`'s node for the block; after it, the bystander must get five
    more batches acknowledged (within 30 s: the node still serves), every batch it sent
    must read back in order, and the node be healthy."""
    b = Bystander(client, pchannel)
    task = asyncio.ensure_future(b.run())
    await asyncio.sleep(0.2)
    yield b
    after = len(b.acked) + 25  # five batches of five
    await wait_for(
        lambda: len(b.acked) >= after or task.done(), 30, what="the bystander's next batches"
    )
    assert len(b.acked) >= after, "the bystander stopped: the node stalled"
    b.stop.set()
    await asyncio.wait_for(task, 30)
    await b.verify()
    states = await client.component_states()
    assert states.state.state_code == 1  # Healthy


# -- seed-style raw streams (what a client generated from the seed sends) ------------------


@dataclass
class RawMessage:
    offset: int
    payload: bytes
    properties: dict[str, str]

    @property
    def is_tick(self) -> bool:
        return self.properties.get(PROP_TYPE) == TICK_TYPE


class RawProducer:
    """A Produce stream speaking per-message ProduceMessageRequest, as the seed does."""

    def __init__(self, address: str, pchannel: str, term: int) -> None:
        self._channel = make_channel(address)
        header = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=pchannel, term=term))
        method = self._channel.stream_stream(
            HANDLER + "Produce",
            request_serializer=pb.ProduceRequest.SerializeToString,
            response_deserializer=pb.ProduceResponse.FromString,
        )
        self.call = method(metadata=(("create-producer-bin", header.SerializeToString()),))
        self._rid = 0

    async def open(self) -> pb.CreateProducerResponse:
        try:
            first = await self.call.read()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        assert first.WhichOneof("response") == "create", first
        return first.create

    async def send(self, payload: bytes, properties: dict[str, str] | None = None):
        """One message, one response: the ProduceMessageResponse."""
        self._rid += 1
        msg = pb.Message(payload=payload, properties=properties or {})
        await self.call.write(
            pb.ProduceRequest(produce=pb.ProduceMessageRequest(request_id=self._rid, message=msg))
        )
        resp = await asyncio.wait_for(self.call.read(), 10)
        assert resp.WhichOneof("response") == "produce", resp
        assert resp.produce.request_id == self._rid
        return resp.produce

    async def send_ok(self, payload: bytes, properties: dict[str, str] | None = None) -> int:
        resp = await self.send(payload, properties)
        assert resp.WhichOneof("response") == "result", resp
        return decode_offset(resp.result.id.id)

    async def close(self) -> None:
        await self.call.write(pb.ProduceRequest(close=pb.CloseProducerRequest()))
        resp = await asyncio.wait_for(self.call.read(), 10)
        assert resp.WhichOneof("response") == "close", resp
        await self._channel.close()


class RawConsumer:
    """A Consume stream without streamwal's options: one ConsumeMessageReponse per message."""

    def __init__(
        self,
        address: str,
        pchannel: str,
        term: int,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
    ) -> None:
        self._channel = make_channel(address)
        header = pb.CreateConsumerRequest(
            pchannel=pb.PChannelInfo(name=pchannel, term=term),
            deliver_policy=policy.to_proto() if policy else None,  # None: the seed's unset
            deliver_filters=[f.to_proto() for f in filters],
        )
        method = self._channel.stream_stream(
            HANDLER + "Consume",
            request_serializer=pb.ConsumeRequest.SerializeToString,
            response_deserializer=pb.ConsumeResponse.FromString,
        )
        self.call = method(metadata=(("create-consumer-bin", header.SerializeToString()),))

    async def open(self) -> pb.CreateConsumerResponse:
        try:
            first = await self.call.read()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        assert first.WhichOneof("response") == "create", first
        return first.create

    async def next(self, timeout: float = 10.0) -> RawMessage:
        resp = await asyncio.wait_for(self.call.read(), timeout)
        assert resp is not aio.EOF, "consumer stream ended"
        assert resp.WhichOneof("response") == "consume", resp
        m = resp.consume
        props = dict(m.message.properties)
        assert PROP_TIME_TICK in props and PROP_TERM in props, props
        return RawMessage(decode_offset(m.id.id), m.message.payload, props)

    async def data(self, count: int, timeout: float = 10.0) -> list[RawMessage]:
        out: list[RawMessage] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"only {len(out)} of {count} messages within {timeout}s")
            msg = await self.next(left)
            if not msg.is_tick:
                out.append(msg)
        return out

    async def close(self) -> None:
        await self.call.write(pb.ConsumeRequest(close=pb.CloseConsumerRequest()))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # frames already in flight come first
            resp = await asyncio.wait_for(self.call.read(), 10)
            assert resp is not aio.EOF, "no close response"
            if resp.WhichOneof("response") == "close":
                break
        await self._channel.close()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(samples, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported; have {sorted({k[0] for k in samples})}"
    return samples[key]
