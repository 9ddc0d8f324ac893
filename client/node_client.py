"""asyncio client of one streaming node: manager calls, producers and consumers.

The producer batches and pipelines: messages sent while earlier batches are in flight
are gathered into the next batch (up to size limits), with at most `max_in_flight`
batches unacknowledged, as Kafka's producer does. A lone `send` therefore goes out at
once (low latency) and many concurrent sends share frames and fsyncs (high throughput).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from grpc import aio

from streamwal.client import encoding
from streamwal.client.consumed import ConsumedBatch, ConsumedMessage
from streamwal.client.policy import DeliverPolicy
from streamwal.client.produce_wire import WireProduceCall, open_wire_producer
from streamwal.client.txn import Txn
from streamwal.errors import (
    InvalidRequestSeq,
    InvalidTransactionState,
    StreamingError,
    Unavailable,
    is_fencing_error,
)
from streamwal.grpc_errors import from_rpc_error
from streamwal.ids import decode_offset, encode_offset
from streamwal.message import PROP_TERM, PROP_TIME_TICK
from streamwal.proto import groups_pb2 as gpb
from streamwal.proto import milvus_pb2, wire_pb2
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig, make_channel

log = logging.getLogger("streamwal.client")

_HANDLER = "/milvus.proto.streaming.StreamingNodeHandlerService/"
_MANAGER = "/milvus.proto.streaming.StreamingNodeManagerService/"
_REPLICATION = "/milvus.proto.streaming.StreamingNodeReplicationService/"
ACK_LEVELS = {
    None: pb.ACK_LEVEL_DEFAULT,
    "default": pb.ACK_LEVEL_DEFAULT,
    "leader": pb.ACK_LEVEL_LEADER,
    "quorum": pb.ACK_LEVEL_QUORUM,
}
_GROUPS = "/streamwal.groups.StreamingNodeConsumerGroupService/"
_INFO = "/streamwal.wire.StreamingNodeInfoService/"


@dataclass(frozen=True, slots=True)
class AppendResult:
    offset: int
    time_tick: int


def replica_set(
    leader: bool, members: Sequence[tuple[int, str]], leader_node: tuple[int, str] | None = None
) -> pb.ReplicaSet:
    """The Assign's replica set: this node's role, every member (node id, address), and
    the leader (for a follower)."""
    rs = pb.ReplicaSet(
        role=pb.REPLICA_ROLE_LEADER if leader else pb.REPLICA_ROLE_FOLLOWER,
        members=[pb.StreamingNodeInfo(server_id=i, address=a) for i, a in members],
    )
    if leader_node is not None:
        rs.leader.server_id, rs.leader.address = leader_node
    return rs


class NodeClient:
    """One gRPC channel to one node, and producers on the node's produce port.

    Producers use the node's produce port (plain TCP frames, proto/wire.proto) when the
    node has one, for lower latency, and gRPC otherwise; `produce_port=False` or
    STREAMWAL_PRODUCE_PORT=off keeps them on gRPC. TLS always keeps them on gRPC.
    """

    def __init__(
        self,
        address: str,
        transport: TransportConfig | None = None,
        *,
        produce_port: bool | None = None,
    ) -> None:
        self.address = address
        transport = transport or TransportConfig.from_env()
        self._channel = make_channel(address, transport)
        if produce_port is None:
            produce_port = os.environ.get("STREAMWAL_PRODUCE_PORT", "on").lower() not in (
                "off",
                "0",
                "false",
                "no",
            )
        self._use_produce_port = produce_port and not transport.tls
        self._produce_port: int | None = None  # from Describe; None: not asked yet
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()

    async def __aenter__(self) -> NodeClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """End the producers opened here that are still open, without waiting for their
        outstanding messages, then the channel. A produce port producer has a connection
        of its own, and every producer a send task: neither may outlive its client (an
        application that leaves `async with NodeClient(...)` on an error, a failed Spark
        task in a reused worker)."""
        for producer in list(self._producers):
            await producer.abandon()
        await self._channel.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    async def _unary(self, method: str, request, response_cls):
        call = self._channel.unary_unary(
            method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString,
        )
        try:
            return await call(request)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def assign(
        self,
        pchannel: str,
        term: int,
        *,
        retention_age_ms: int | None = None,
        retention_bytes: int | None = None,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
    ) -> None:
        """Make the node serve `pchannel` under `term`; a retention bound replaces its policy;
        with `replica_set` (see `replica_set()`) it leads or follows a replicated pchannel;
        `accept_data_loss` serves a damaged single-replica log from above its loss."""
        req = pb.StreamingNodeManagerAssignRequest(
            pchannel=pb.PChannelInfo(name=pchannel, term=term),
            catch_up_from=catch_up_from,
            min_next_offset=min_next_offset,
            replica_set=replica_set,
            accept_data_loss=accept_data_loss,
        )
        if retention_age_ms is not None or retention_bytes is not None:
            req.retention.max_age_ms = retention_age_ms or 0
            req.retention.max_bytes = retention_bytes or 0
        await self._unary(_MANAGER + "Assign", req, pb.StreamingNodeManagerAssignResponse)

    async def fence(self, pchannel: str, term: int) -> pb.FenceResponse:
        """Raise the node's accepted term of `pchannel` (it stops leading or following lower
        terms) and learn its log: last record's term, log end, commit offset."""
        req = pb.FenceRequest(pchannel=pb.PChannelInfo(name=pchannel, term=term))
        return await self._unary(_REPLICATION + "Fence", req, pb.FenceResponse)

    async def remove(self, pchannel: str, term: int) -> None:
        req = pb.StreamingNodeManagerRemoveRequest(
            pchannel=pb.PChannelInfo(name=pchannel, term=term)
        )
        await self._unary(_MANAGER + "Remove", req, pb.StreamingNodeManagerRemoveResponse)

    async def collect_status(self) -> pb.StreamingNodeManagerCollectStatusResponse:
        return await self._unary(
            _MANAGER + "CollectStatus",
            pb.StreamingNodeManagerCollectStatusRequest(),
            pb.StreamingNodeManagerCollectStatusResponse,
        )

    async def component_states(self) -> milvus_pb2.ComponentStates:
        return await self._unary(
            "/milvus.proto.streaming.StreamingNodeStateService/GetComponentStates",
            milvus_pb2.GetComponentStatesRequest(),
            milvus_pb2.ComponentStates,
        )

    # -- consumer groups (RocksMQ-style, seed 001): cursors kept by the node ----------------
    # Each call names the pchannel and the term it is served under, like producer() and
    # consumer(); errors: ChannelNotExist / UnmatchedChannelTerm / ChannelFenced for the
    # pchannel, ConsumerGroupNotExist for an unknown group. Cursors live in the pchannel's
    # log, so they survive node restarts and move with the pchannel.

    async def create_consumer_group(self, pchannel: str, term: int, group: str) -> int:
        """Create `group` with its cursor at the oldest retained offset (returned); raises
        ConsumerGroupExist if it exists (not idempotent: two creators learn of each other)."""
        resp = await self._unary(
            _GROUPS + "CreateConsumerGroup",
            gpb.CreateConsumerGroupRequest(pchannel=_info(pchannel, term), group=group),
            gpb.CreateConsumerGroupResponse,
        )
        return resp.cursor

    async def destroy_consumer_group(self, pchannel: str, term: int, group: str) -> None:
        await self._unary(
            _GROUPS + "DestroyConsumerGroup",
            gpb.DestroyConsumerGroupRequest(pchannel=_info(pchannel, term), group=group),
            gpb.DestroyConsumerGroupResponse,
        )

    async def group_consume(
        self, pchannel: str, term: int, group: str, n: int, *, consumer_id: str = "", claim: int = 0
    ) -> list[ConsumedMessage]:
        """Up to `n` messages after the group's cursor, which the node advances past them
        before answering: concurrent consumers of a group never get the same message.
        Empty when the group has read everything. TimeTick messages are left out; a
        committed txn is never split: one larger than `n` comes whole.

        Without a `consumer_id` a call whose answer is lost loses its messages (at most
        once). With one, number each new call (`claim`) and repeat the number when
        retrying: the node answers a repeated claim with the same messages again.
        """
        resp = await self._unary(
            _GROUPS + "GroupConsume",
            gpb.GroupConsumeRequest(
                pchannel=_info(pchannel, term),
                group=group,
                max_messages=n,
                consumer_id=consumer_id,
                claim=claim,
            ),
            gpb.GroupConsumeResponse,
        )
        return [m for b in resp.batches for m in ConsumedBatch(b)]

    async def group_seek(
        self, pchannel: str, term: int, group: str, message_id: int | pb.MessageID
    ) -> None:
        """The group's next consume starts at `message_id` (an offset or a MessageID)."""
        mid = message_id if isinstance(message_id, pb.MessageID) else _message_id(message_id)
        await self._unary(
            _GROUPS + "GroupSeek",
            gpb.GroupSeekRequest(pchannel=_info(pchannel, term), group=group, message_id=mid),
            gpb.GroupSeekResponse,
        )

    async def producer(self, pchannel: str, term: int, **options) -> Producer:
        producer = Producer(self._channel, pchannel, term, **options)
        self._producers.add(producer)
        tried = set()
        while (where := await self._produce_address()) is not None and where not in tried:
            tried.add(where)
            try:
                await producer.open(where)
                return producer
            except (OSError, TimeoutError) as exc:  # the port is gone (node restarted?)
                log.debug("produce port unreachable", extra={"error": repr(exc)})
                self._produce_port = None  # ask again; gRPC if the node names the same port
            except StreamingError:
                # A restarted node listens on a new port, and its old one may now belong to
                # another node, whose refusal is not this node's answer: ask again, and
                # raise only if this node still names the port that refused.
                self._produce_port = None
                if await self._produce_address() == where:
                    raise
        await producer.open()
        return producer

    async def describe(self) -> wire_pb2.DescribeNodeResponse:
        """The node's id and produce port (raises grpc.RpcError, UNIMPLEMENTED on nodes
        older than the produce port)."""
        call = self._channel.unary_unary(
            _INFO + "Describe",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=wire_pb2.DescribeNodeResponse.FromString,
        )
        return await call(wire_pb2.DescribeNodeRequest())

    async def _produce_address(self) -> tuple[str, int] | None:
        """(host, port) of the node's produce port; None: produce over gRPC."""
        if not self._use_produce_port:
            return None
        host, _, _ = self.address.rpartition(":")
        if not host or "/" in host:  # not HOST:PORT (a resolver URI): stay on gRPC
            return None
        if self._produce_port is None:
            try:
                self._produce_port = (await self.describe()).produce_port
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older node: gRPC only
                    self._produce_port = 0
                return None  # unreachable now: the gRPC open will say so
        return (host.strip("[]"), self._produce_port) if self._produce_port else None

    async def consumer(
        self,
        pchannel: str,
        term: int,
        policy: pb.DeliverPolicy | None = None,
        filters: Sequence[pb.DeliverFilter] = (),
        *,
        time_ticks: bool = True,
        end_offset: int | None = None,
    ) -> Consumer:
        """Read `pchannel` from `policy` on; `time_ticks=False` leaves out TimeTick messages;
        with `end_offset` the iteration ends once every offset below it was delivered."""
        consumer = Consumer(
            self._channel,
            pchannel,
            term,
            policy or DeliverPolicy.all(),
            filters,
            time_ticks,
            end_offset,
        )
        await consumer.open()
        return consumer


def _info(pchannel: str, term: int) -> pb.PChannelInfo:
    return pb.PChannelInfo(name=pchannel, term=term)


def _message_id(offset: int) -> pb.MessageID:
    return pb.MessageID(id=encode_offset(offset))


async def _open_stream(channel: aio.Channel, rpc: str, header, response_cls, serializer):
    """Open a Produce/Consume stream with its header in binary metadata (the seed's
    convention) and return (call, first response), which must be the `create` member."""
    key = "create-producer-bin" if rpc == "Produce" else "create-consumer-bin"
    method = channel.stream_stream(
        _HANDLER + rpc,
        request_serializer=serializer,
        response_deserializer=response_cls.FromString,
    )
    call = method(metadata=((key, header.SerializeToString()),))
    try:
        first = await call.read()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    if first is aio.EOF or first.WhichOneof("response") != "create":
        raise InvalidRequestSeq(f"the node did not answer the {rpc} header with `create`")
    return call, first


class _Batch:
    """Messages sent as one frame; `sequence` is fixed when first written and kept on resend."""

    __slots__ = ("barrier", "count", "entries", "future", "sequence", "size")

    def __init__(self, barrier: int = 0) -> None:
        self.entries: list[bytes] = []
        self.size = 0
        self.count = 0
        self.sequence = 0
        self.barrier = barrier  # every tick of the batch must be above it
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()


class _TxnOp(_Batch):
    """A txn request queued like a batch: same order on the stream, same in-flight slots.
    Only a commit takes a sequence number (only it appends)."""

    __slots__ = ("commit", "request")

    def __init__(self, request: pb.TxnRequest, commit: bool) -> None:
        super().__init__()
        self.request = request
        self.commit = commit

    def frame(self, request_id: int) -> bytes:
        self.request.request_id = request_id
        if self.commit:
            self.request.commit.sequence = self.sequence
        return pb.ProduceRequest(txn=self.request).SerializeToString()


class _Slots:
    """Frames in flight on one stream, at most `limit`: one is taken before a frame is
    written and given back when it is answered or failed. Unlike a Semaphore it can be
    taken without awaiting, which the direct write of a lone send needs."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._freed = asyncio.Event()

    def try_take(self) -> bool:
        if self._free <= 0:
            return False
        self._free -= 1
        return True

    async def take(self) -> None:
        while not self.try_take():
            self._freed.clear()
            await self._freed.wait()

    def give(self) -> None:
        self._free += 1
        self._freed.set()


class Producer:
    """Appends to one pchannel under one term; see the module docstring for batching.

    Producers are idempotent by default: they name themselves (`producer_id`, random
    unless given) and number their batches, so a batch resent after a broken stream is
    answered by the node instead of appended twice. With `resendable=True` a broken
    stream does not fail the pending sends: the owner (the routing layer) takes them with
    `detach_unacknowledged()` and hands them to a new producer with `adopt()`.

    `idempotent=False` gives that up for latency: the node then keeps no per-producer
    state and persists no result window with each batch (about a quarter of its work per
    one-message batch on a small machine, docs/benchmarks.md), and a batch whose answer
    was lost with a broken stream may be appended twice if the application sends it
    again. Redis's XADD and a NATS publish without a message id give the same guarantee.

    `ack_level` on a replicated pchannel: "quorum" answers once the batch is stored on a
    majority of the replicas (the default with several), "leader" once synced on the leader.
    """

    def __init__(
        self,
        channel: aio.Channel,
        pchannel: str,
        term: int,
        *,
        producer_id: str | None = None,
        max_batch_bytes: int = 1024 * 1024,
        max_batch_messages: int = 8192,
        max_in_flight: int = 8,
        resendable: bool = False,
        ack_level: str | None = None,
        idempotent: bool = True,
    ) -> None:
        if ack_level not in ACK_LEVELS:
            raise ValueError(f"ack_level must be 'leader', 'quorum' or None, not {ack_level!r}")
        if not idempotent and (producer_id is not None or resendable):
            raise ValueError(
                "a producer_id or resendable=True needs an idempotent producer: without one, "
                "a resent batch would be appended twice"
            )
        self.ack_level = ACK_LEVELS[ack_level]
        self.pchannel = pchannel
        self.term = term
        # The node keeps idempotence state only for a named producer: "" opts out.
        if not idempotent:
            self.producer_id = ""
        else:
            self.producer_id = uuid.uuid4().hex if producer_id is None else producer_id
        self._channel = channel
        self._max_bytes = max_batch_bytes
        self._max_messages = max_batch_messages
        self._slots = _Slots(max_in_flight)
        self._resendable = resendable
        self._ids = itertools.count(1)
        self._next_sequence = 1
        self._waiting: dict[int, _Batch] = {}
        self._open_batch: _Batch | None = None
        self._holding: _Batch | None = None  # taken from the queue, waiting for a slot
        self._props_cache: dict[tuple, bytes] = {}
        self._error: StreamingError | None = None
        self.broken = asyncio.Event()  # set when the stream fails
        self._call = None
        self._writing = False  # the sender task awaits a write (the transport is busy)
        self._direct = False  # on the produce port, whose frames a send may write itself
        self._reader: asyncio.Future | None = None  # done when the answers end
        self._sender: asyncio.Task | None = None
        self._queue: asyncio.Queue[_Batch] = asyncio.Queue()
        self.last_sequence = 0  # what the node had from this producer id when we opened

    async def open(self, produce_port: tuple[str, int] | None = None) -> None:
        """Open the stream: on the node's produce port at (host, port), else over gRPC."""
        header = pb.CreateProducerRequest(
            pchannel=pb.PChannelInfo(name=self.pchannel, term=self.term),
            producer_id=self.producer_id,
            ack_level=self.ack_level,
        )
        if produce_port is not None:
            self._call, first = await open_wire_producer(*produce_port, header)
        else:
            # Frames are encoded by hand (client/encoding.py): the serializer passes bytes on.
            self._call, first = await _open_stream(
                self._channel, "Produce", header, pb.ProduceResponse, lambda raw: raw
            )
        self._direct = isinstance(self._call, WireProduceCall)
        self.last_sequence = first.create.last_sequence
        self._next_sequence = max(self._next_sequence, self.last_sequence + 1)
        if self._direct:  # the port hands answers over as they arrive, no reader task
            self._reader = self._call.listen(self._answered, self._ended)
        else:
            self._reader = asyncio.ensure_future(self._read())
        self._sender = asyncio.ensure_future(self._send_loop())

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def error(self) -> StreamingError | None:
        return self._error

    @property
    def transport(self) -> str:
        """How this producer reaches its node: "produce port" or "gRPC"."""
        return "produce port" if isinstance(self._call, WireProduceCall) else "gRPC"

    def _props(self, vchannel, msg_type, properties) -> bytes:
        if vchannel is None and msg_type is None and not properties:
            return b""
        key = (vchannel, msg_type, tuple(sorted(properties.items())) if properties else ())
        blob = self._props_cache.get(key)
        if blob is None:
            props = encoding.message_properties(vchannel, msg_type, properties)
            blob = encoding.encode_properties(props)
            if len(self._props_cache) < 1024:
                self._props_cache[key] = blob
        return blob

    def encode(
        self,
        payload: bytes,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> bytes:
        """One message as `send` would write it (an element of a MessageBatch)."""
        return encoding.encode_entry(payload, self._props(vchannel, msg_type, properties))

    async def begin_txn(self, vchannel: str, keepalive: float | None = None) -> Txn:
        """Begin a transaction on `vchannel` (a vchannel of this producer's pchannel).

        `keepalive` (seconds) is how long the txn may go without an append before the node
        expires it; None uses the node's default (`streamwal node --txn-keepalive`). See
        client/txn.py for append / commit / rollback and their errors.
        """
        keepalive_ms = 0 if keepalive is None else max(1, round(keepalive * 1000))
        resp = await self.txn_request(
            pb.TxnRequest(begin=pb.TxnBegin(vchannel=vchannel, keepalive_ms=keepalive_ms))
        )
        return Txn(self, vchannel, resp.begun.txn_id, resp.begun.keepalive_ms / 1000)

    async def txn_request(self, request: pb.TxnRequest, commit: bool = False) -> pb.TxnResponse:
        """Send a TxnRequest on this producer's stream; the node's answer, or its error."""
        self._raise_if_failed()
        op = _TxnOp(request, commit)
        self._queue.put_nowait(op)
        return await asyncio.shield(op.future)

    async def send(
        self,
        payload: bytes,
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> AppendResult:
        """Append one message; returns once it is durable on the node."""
        self._raise_if_failed()
        entry = encoding.encode_entry(payload, self._props(vchannel, msg_type, properties))
        batch = self._open_batch
        if batch is None and self._can_write_now():
            batch = _Batch()
            batch.entries.append(entry)
            batch.size = len(entry)
            batch.count = 1
            self._call.write_now(self._dispatch(batch))
            return AppendResult(*await batch.future)  # its only message: no shield needed
        if (
            batch is None
            or batch.size + len(entry) > self._max_bytes
            or batch.count >= self._max_messages
        ):
            batch = self._open_batch = _Batch()
            self._queue.put_nowait(batch)
        index = batch.count
        batch.entries.append(entry)
        batch.size += len(entry)
        batch.count += 1
        base, tick = await asyncio.shield(batch.future)
        return AppendResult(base + index, tick + index)

    async def send_many(
        self,
        payloads: Iterable[bytes],
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
        barrier_time_tick: int = 0,
    ) -> list[AppendResult]:
        """Append all payloads as one atomic batch (same vchannel, type and properties);
        their ticks are above `barrier_time_tick`."""
        blob = self._props(vchannel, msg_type, properties)
        entries = [encoding.encode_entry(p, blob) for p in payloads]
        if not entries:
            return []
        base, tick = await self.send_batch(entries, barrier_time_tick)
        return [AppendResult(base + i, tick + i) for i in range(len(entries))]

    async def send_batch(
        self, entries: list[bytes], barrier_time_tick: int = 0, sequence: int = 0
    ) -> tuple[int, int]:
        """Append entries made by encoding.encode_entry atomically: (first offset, first tick).
        Every tick of the batch is above `barrier_time_tick` (0: no barrier).

        `sequence` pins the batch's number (0: the next one): a writer that must append a
        batch once across restarts (the coord's broadcaster) names it the same every time.
        """
        self._raise_if_failed()
        if sequence and not self.producer_id:
            raise ValueError("a pinned sequence needs an idempotent producer")
        batch = _Batch(barrier_time_tick)
        batch.entries = entries
        batch.count = len(entries)
        if sequence:
            batch.sequence = sequence
            self._next_sequence = max(self._next_sequence, sequence + 1)
        self._queue.put_nowait(batch)
        return await asyncio.shield(batch.future)

    def _raise_if_failed(self) -> None:
        if self._error is not None and not self._resendable:
            raise self._error

    def _can_write_now(self) -> bool:
        """Whether a send may write its frame itself instead of handing it to the sender
        task: on the produce port, with nothing in flight, queued or being written (so
        sends that come together still share a frame), and with the transport idle.
        Waking the sender task and then the caller cost a one-at-a-time producer two
        event-loop turns per message."""
        return (
            self._direct
            and self._error is None
            and not self._waiting
            and self._holding is None
            and not self._writing
            and self._queue.empty()
            and self._call.can_write_now()
            and self._slots.try_take()
        )

    def _dispatch(self, batch: _Batch) -> bytes:
        """Number `batch`, wait for its answer under a new request id, and frame it."""
        is_txn = isinstance(batch, _TxnOp)
        if not batch.sequence and self.producer_id and (not is_txn or batch.commit):
            batch.sequence = self._next_sequence
            self._next_sequence += 1
        rid = next(self._ids)
        self._waiting[rid] = batch
        if is_txn:
            return batch.frame(rid)
        return encoding.produce_batch_frame(
            rid, b"".join(batch.entries), batch.sequence, batch.barrier
        )

    async def _send_loop(self) -> None:
        try:
            while True:
                batch = self._holding = await self._queue.get()
                await self._slots.take()
                self._holding = None
                if batch is self._open_batch:
                    self._open_batch = None  # later sends start a new batch
                if self._error is not None:  # the stream broke while this batch waited
                    self._slots.give()
                    if self._resendable:
                        self._queue.put_nowait(batch)  # left for detach_unacknowledged
                        return
                    _fail_batch(batch, self._error)
                    continue
                self._writing = True
                try:
                    await self._call.write(self._dispatch(batch))
                finally:
                    self._writing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(
                from_rpc_error(exc) if isinstance(exc, grpc.RpcError) else Unavailable(str(exc))
            )

    async def _read(self) -> None:
        """gRPC's answers, read by a task."""
        try:
            while True:
                resp = await self._call.read()
                if resp is aio.EOF or not self._answered(resp):
                    break
            self._ended(None)
        except grpc.RpcError as exc:
            self._ended(from_rpc_error(exc))
        except asyncio.CancelledError:
            raise

    def _answered(self, resp: pb.ProduceResponse) -> bool:
        """Settle what `resp` answers; False once the stream is over for this producer."""
        kind = resp.WhichOneof("response")
        if kind == "produce_batch":
            r = resp.produce_batch
            batch = self._waiting.pop(r.request_id, None)
            self._slots.give()
            if batch is None or batch.future.done():
                return True
            if r.WhichOneof("response") == "error":
                err = StreamingError.from_proto(r.error)
                if self._resendable and is_fencing_error(err):
                    self._waiting[r.request_id] = batch  # keep it for the resend
                    self._fail(err)
                    return False
                batch.future.set_exception(err)
            else:
                batch.future.set_result(
                    (decode_offset(r.result.first_id.id), r.result.first_time_tick)
                )
        elif kind == "txn":
            self._txn_answered(resp.txn)
        elif kind == "close":
            return False
        return True

    def _ended(self, err: StreamingError | None) -> None:
        self._fail(err or Unavailable("producer stream closed"))

    def _txn_answered(self, r: pb.TxnResponse) -> None:
        op = self._waiting.pop(r.request_id, None)
        self._slots.give()
        if op is None or op.future.done():
            return
        if r.WhichOneof("response") != "error":
            op.future.set_result(r)
            return
        err = StreamingError.from_proto(r.error)
        if self._resendable and op.commit and is_fencing_error(err):
            self._waiting[r.request_id] = op  # a commit is resent like a batch
            self._fail(err)
            return
        op.future.set_exception(err)

    def _fail(self, err: StreamingError) -> None:
        if self._error is None:
            self._error = err
        self.broken.set()
        if self._resendable:
            return  # the owner detaches the pending batches and resends them elsewhere
        for batch in self._waiting.values():
            self._slots.give()
            _fail_batch(batch, err)
        self._waiting.clear()
        while not self._queue.empty():
            _fail_batch(self._queue.get_nowait(), err)

    def detach_unacknowledged(self) -> list[_Batch]:
        """Every batch sent or queued but not answered, oldest first; this producer
        forgets them (their futures stay pending for whoever resends them)."""
        pending = sorted(
            (b for b in self._waiting.values() if not b.future.done()), key=lambda b: b.sequence
        )
        self._waiting.clear()
        queued = [self._holding] if self._holding is not None else []
        self._holding = None
        while not self._queue.empty():
            queued.append(self._queue.get_nowait())
        pending += [b for b in queued if not b.future.done() and b not in pending]
        self._open_batch = None
        for op in pending:  # txns stay on their node: only a commit's outcome can be asked
            if isinstance(op, _TxnOp) and not op.commit:
                _fail_batch(op, InvalidTransactionState("txn lost: the pchannel moved"))
        return [b for b in pending if not b.future.done()]

    def adopt(self, batches: list[_Batch]) -> None:
        """Send `batches` (from a broken producer with the same id) before anything new."""
        for batch in batches:
            if batch.sequence:
                self._next_sequence = max(self._next_sequence, batch.sequence + 1)
            self._queue.put_nowait(batch)

    async def close(self) -> None:
        """Wait for every outstanding message, then close the stream."""
        if self._call is None:
            return
        while (self._waiting or not self._queue.empty()) and self._error is None:
            await asyncio.sleep(0.001)
        await self.abandon(graceful=self._error is None)

    async def abandon(self, graceful: bool = False) -> None:
        """Stop without waiting for outstanding messages (the routing layer's exit)."""
        if self._call is None:
            return
        if self._sender:
            self._sender.cancel()
        if graceful:
            try:
                await self._call.write(encoding.close_frame())
                await self._call.done_writing()
                await asyncio.wait_for(self._reader, 5)
            except (
                grpc.RpcError,
                StreamingError,
                ConnectionError,
                TimeoutError,
                asyncio.CancelledError,
                asyncio.InvalidStateError,
            ):
                # InvalidStateError: the RPC ended before our reader noticed (nothing to say)
                pass
        if self._reader:
            self._reader.cancel()
        self._call.cancel()
        self._error = self._error or Unavailable("producer closed")
        self._call = None


def _fail_batch(batch: _Batch, err: StreamingError) -> None:
    if not batch.future.done():
        batch.future.set_exception(err)


class Consumer:
    """Reads one pchannel under one term; an async iterator of ConsumedMessage."""

    def __init__(
        self,
        channel: aio.Channel,
        pchannel: str,
        term: int,
        policy: pb.DeliverPolicy,
        filters: Sequence[pb.DeliverFilter],
        time_ticks: bool = True,
        end_offset: int | None = None,
    ) -> None:
        self.pchannel = pchannel
        self._time_ticks = time_ticks
        self._end_offset = end_offset
        self.term = term
        self._channel = channel
        self._policy = policy
        self._filters = list(filters)
        self._call = None
        self._buffer: list[ConsumedMessage] = []
        self._pos = 0
        self.first_offset = 0
        self.next_offset = 0  # log end when the consumer opened

    async def open(self) -> None:
        header = pb.CreateConsumerRequest(
            pchannel=pb.PChannelInfo(name=self.pchannel, term=self.term),
            deliver_policy=self._policy,
            deliver_filters=self._filters,
            options=pb.ConsumerOptions(
                batched=True, skip_time_ticks=not self._time_ticks, end_offset=self._end_offset
            ),
        )
        self._call, first = await _open_stream(
            self._channel, "Consume", header, pb.ConsumeResponse, lambda m: m.SerializeToString()
        )
        self.first_offset = first.create.first_offset
        self.next_offset = first.create.next_offset

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[ConsumedMessage]:
        return self

    async def __anext__(self) -> ConsumedMessage:
        if self._pos < len(self._buffer):
            msg = self._buffer[self._pos]
            self._pos += 1
            return msg
        batch = await self.next_batch()
        if batch is None:
            raise StopAsyncIteration
        self._buffer, self._pos = batch, 1
        return batch[0]

    async def next_batch(self) -> Sequence[ConsumedMessage] | None:
        """The next frame's messages (None when the node closed the stream); a
        ConsumedBatch for a batch frame, whose `payloads` column skips per-message objects."""
        while True:
            try:
                resp = await self._call.read()
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None
            if resp is aio.EOF:
                return None
            kind = resp.WhichOneof("response")
            if kind == "consume_batch":
                return ConsumedBatch(resp.consume_batch)
            if kind == "consume":
                m = resp.consume
                props = m.message.properties
                return [
                    ConsumedMessage(
                        decode_offset(m.id.id),
                        int(props.get(PROP_TERM, self.term)),
                        int(props.get(PROP_TIME_TICK, 0)),
                        m.message,
                    )
                ]
            if kind == "close":
                return None

    async def close(self) -> None:
        if self._call is None:
            return
        try:
            await self._call.write(pb.ConsumeRequest(close=pb.CloseConsumerRequest()))
            await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass
        self._call.cancel()
        self._call = None
