"""asyncio client of one streaming node: manager calls, producers and consumers.

The producer itself is client/producer.py (a thin loop over the ledger of
client/produce_ledger.py and the produce-call protocol of client/produce_call.py);
`NodeClient.producer` picks its transport (the produce port or gRPC) and bounds its open.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import AsyncIterator, Sequence

import grpc
from grpc import aio

from streamwal.client.consumed import ConsumedBatch, ConsumedMessage
from streamwal.client.node_streams import open_stream
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.producer import Appended, AppendedBatch, Producer
from streamwal.errors import StreamingError, Unavailable
from streamwal.grpc_errors import from_rpc_error
from streamwal.ids import decode_offset, encode_offset
from streamwal.message import PROP_TERM, PROP_TIME_TICK
from streamwal.proto import groups_pb2 as gpb
from streamwal.proto import milvus_pb2, wire_pb2
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig, internal_address, make_channel

log = logging.getLogger("streamwal.client")

_MANAGER = "/milvus.proto.streaming.StreamingNodeManagerService/"
_REPLICATION = "/milvus.proto.streaming.StreamingNodeReplicationService/"
_GROUPS = "/streamwal.groups.StreamingNodeConsumerGroupService/"
_INFO = "/streamwal.wire.StreamingNodeInfoService/"
CONSUMER_CLOSE_WAIT_S = 2.0  # how long Consumer.close waits for the node to end the stream


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


class GroupBatch(list):
    """What a group consume got (a list of ConsumedMessage); `redelivered`: they had
    gone to a consumer that left without committing them."""

    def __init__(self, messages: list[ConsumedMessage], redelivered: bool = False) -> None:
        super().__init__(messages)
        self.redelivered = redelivered


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
        self._transport = transport
        self._channel = make_channel(address, transport)
        # The node's internal listener (Assign, Remove, Fence): opened at
        # the first such call, from the port the node's Describe names.
        self._internal: aio.Channel | None = None
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
        if self._internal is not None:
            await self._internal.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    async def _unary(self, method: str, request, response_cls, internal: bool = False):
        try:
            if internal and self._internal is None:
                where = await internal_address(self.address, self._transport)
                if self._internal is None:  # another call may have opened it meanwhile
                    self._internal = make_channel(where, self._transport)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        channel = self._internal if internal and self._internal else self._channel
        call = channel.unary_unary(
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
        await self._unary(_MANAGER + "Assign", req, pb.StreamingNodeManagerAssignResponse, True)

    async def fence(self, pchannel: str, term: int) -> pb.FenceResponse:
        """Raise the node's accepted term of `pchannel` (it stops leading or following lower
        terms) and learn its log: last record's term, log end, commit offset."""
        req = pb.FenceRequest(pchannel=pb.PChannelInfo(name=pchannel, term=term))
        return await self._unary(_REPLICATION + "Fence", req, pb.FenceResponse, True)

    async def remove(self, pchannel: str, term: int) -> None:
        req = pb.StreamingNodeManagerRemoveRequest(
            pchannel=pb.PChannelInfo(name=pchannel, term=term)
        )
        await self._unary(_MANAGER + "Remove", req, pb.StreamingNodeManagerRemoveResponse, True)

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
        self,
        pchannel: str,
        term: int,
        group: str,
        n: int,
        *,
        consumer_id: str = "",
        claim: int = 0,
        at_least_once: bool = False,
        session_timeout: float = 0.0,
    ) -> GroupBatch:
        """Up to `n` messages after the group's cursor, which the node advances past them
        before answering: concurrent consumers of a group never get the same message.
        Empty when the group has read everything. TimeTick messages are left out; a
        committed txn is never split: one larger than `n` comes whole.

        Without a `consumer_id` a call whose answer is lost loses its messages (at most
        once). With one, number each new call (`claim`) and repeat the number when
        retrying: the node answers a repeated claim with the same messages again.
        `at_least_once` (needs `consumer_id`): the messages stay pending on this consumer
        until `group_commit`; if it is silent for `session_timeout` seconds (0: the
        node's 10 s) they go to the group's next consumes (`redelivered` is then True).
        """
        resp = await self._unary(
            _GROUPS + "GroupConsume",
            gpb.GroupConsumeRequest(
                pchannel=_info(pchannel, term),
                group=group,
                max_messages=n,
                consumer_id=consumer_id,
                claim=claim,
                at_least_once=at_least_once,
                session_timeout_ms=round(session_timeout * 1000),
            ),
            gpb.GroupConsumeResponse,
        )
        return GroupBatch([m for b in resp.batches for m in ConsumedBatch(b)], resp.redelivered)

    async def group_commit(
        self,
        pchannel: str,
        term: int,
        group: str,
        consumer_id: str,
        offset: int | None,
        *,
        leave: bool = False,
        session_timeout: float = 0.0,
    ) -> int:
        """Settle every message `consumer_id` got up to `offset` (inclusive; None: none);
        `leave`: its other uncommitted messages go to the group's other consumers.
        Returns the group's committed offset."""
        resp = await self._unary(
            _GROUPS + "GroupCommit",
            gpb.GroupCommitRequest(
                pchannel=_info(pchannel, term),
                group=group,
                consumer_id=consumer_id,
                offset=offset,
                leave=leave,
                session_timeout_ms=round(session_timeout * 1000),
            ),
            gpb.GroupCommitResponse,
        )
        return resp.committed

    async def describe_consumer_groups(
        self, pchannel: str, term: int, groups: Sequence[str] = ()
    ) -> list[gpb.ConsumerGroupDescription]:
        """Each group's cursor, committed offset, end, lag and members (all groups when
        none is named)."""
        resp = await self._unary(
            _GROUPS + "DescribeConsumerGroups",
            gpb.DescribeConsumerGroupsRequest(pchannel=_info(pchannel, term), groups=groups),
            gpb.DescribeConsumerGroupsResponse,
        )
        return list(resp.groups)

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
        """An open Producer of `pchannel` under `term` (options: see Producer). Opening is
        one request: bounded by `request_timeout` (Unavailable after it)."""
        producer = Producer(self._channel, pchannel, term, **options)
        self._producers.add(producer)
        try:
            async with asyncio.timeout(producer.request_timeout):
                await self._open(producer)
        except TimeoutError:
            await producer.abandon()
            raise Unavailable(
                f"node {self.address}: no producer of {pchannel!r} opened within "
                f"{producer.request_timeout:g}s (request_timeout)"
            ) from None
        except BaseException:
            await producer.abandon()
            raise
        return producer

    async def _open(self, producer: Producer) -> None:
        tried = set()
        while (where := await self._produce_address()) is not None and where not in tried:
            tried.add(where)
            try:
                await producer.open(where)
                return
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
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
    ) -> Consumer:
        """Read `pchannel` from `policy` on; `time_ticks=True` also delivers the node's
        TimeTick messages (left out by default, as on the routed consumers);
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


class Consumer:
    """Reads one pchannel under one term; an async iterator of ConsumedMessage."""

    def __init__(
        self,
        channel: aio.Channel,
        pchannel: str,
        term: int,
        policy: DeliverPolicy,
        filters: Sequence[DeliverFilter],
        time_ticks: bool = False,
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
            deliver_policy=self._policy.to_proto(),
            deliver_filters=[f.to_proto() for f in self._filters],
            options=pb.ConsumerOptions(
                batched=True, skip_time_ticks=not self._time_ticks, end_offset=self._end_offset
            ),
        )
        self._call, first = await open_stream(
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
        """Ask the node to end the stream and wait (at most CONSUMER_CLOSE_WAIT_S) until it
        has: the call's slot on the node is then free, so a consumer opened at once after
        is admitted under --max-streams-per-connection. Frames still in flight are
        dropped."""
        call, self._call = self._call, None
        if call is None:
            return
        try:
            await call.write(pb.ConsumeRequest(close=pb.CloseConsumerRequest()))
            await call.done_writing()
            await asyncio.wait_for(_read_to_end(call), CONSUMER_CLOSE_WAIT_S)
        except (grpc.RpcError, asyncio.InvalidStateError, TimeoutError):
            pass
        call.cancel()


async def _read_to_end(call) -> None:
    while await call.read() is not aio.EOF:
        pass


__all__ = [
    "Appended",
    "AppendedBatch",
    "ConsumedMessage",
    "Consumer",
    "NodeClient",
    "Producer",
    "replica_set",
]
