"""gRPC adapter of the node: the seed's services over the Wal.

Handlers are registered by hand (not through the generated add_*_to_server helpers) so
that request deserialization is ours: a malformed frame becomes a clear
INVAILD_ARGUMENT for that stream instead of an opaque INTERNAL, and other streams are
unaffected.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from streamwal.errors import (
    ChannelNotExist,
    DataLoss,
    Inner,
    InvalidArgument,
    OnShutdown,
    StreamingError,
)
from streamwal.grpc_errors import status_for, trailing
from streamwal.node import delivery, records, validation
from streamwal.node.channel import Channel
from streamwal.node.limits import LimitExceeded
from streamwal.node.produce_stream import (
    Answer,
    Malformed,
    ProduceSink,
    ProduceStream,
    PushedRequests,
)
from streamwal.node.txn import TxnLimits, TxnTable
from streamwal.node.wal import Wal
from streamwal.proto import milvus_pb2
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.service")

PRODUCER_HEADER = "create-producer-bin"
CONSUMER_HEADER = "create-consumer-bin"
READ_RECORDS = 1024  # records per read step while catching up (also bounded by bytes)
BATCH_MARGIN_S = 0.02  # of a batch call's deadline, kept to answer the items done


def _tolerant(cls) -> Callable[[bytes], object]:
    def parse(raw: bytes):
        try:
            return cls.FromString(raw)
        except Exception as exc:
            return Malformed(cls.__name__, exc)

    return parse


async def _abort(context: aio.ServicerContext, err: StreamingError) -> None:
    await context.abort(status_for(err), str(err), trailing_metadata=trailing(err))


def _header(context: aio.ServicerContext, key: str, cls):
    for k, v in context.invocation_metadata() or ():
        if k == key:
            try:
                return cls.FromString(v)
            except DecodeError as exc:
                raise InvalidArgument(f"garbled {key} header: {exc}") from None
    raise InvalidArgument(f"missing {key} header (a serialized {cls.__name__})")


class GrpcProduceSink:
    """A Produce stream's answers over gRPC."""

    def __init__(self, context: aio.ServicerContext) -> None:
        self._context = context

    async def write(self, response: Answer) -> None:
        await self._context.write(response)

    def write_now(self, response: Answer) -> bool:
        return False  # grpc.aio writes only from a coroutine

    async def abort(self, err: StreamingError) -> None:
        await _abort(self._context, err)


class NodeService:
    def __init__(self, wal: Wal) -> None:
        cfg = wal.config
        self.wal = wal
        self.node_id = cfg.node_id
        self.max_message_bytes = cfg.max_message_bytes
        self.max_inflight = cfg.max_inflight_bytes_per_producer
        self.max_pending_answers = cfg.max_pending_answers
        self._ids = itertools.count(1)
        self.serving = True
        self.probe_port = 0  # the probe port, set by the server once bound (0: none)
        limits = TxnLimits(
            cfg.txn_keepalive_s,
            cfg.txn_max_keepalive_s,
            cfg.txn_max_bytes,
            cfg.txn_max_open,
            cfg.txn_max_open_per_stream,
        )
        m = wal.metrics
        self.txns = TxnTable(limits, lambda outcome: m.txns.labels(outcome).inc())
        m.open_txns.set_function(lambda: len(self.txns))

    def count_limit(self, what: StreamingError | str) -> None:
        """Count a refusal (or a slowed producer) by one of the node's limits."""
        if isinstance(what, LimitExceeded):
            what = what.limit
        if isinstance(what, str):
            self.wal.metrics.limit_exceeded.labels(what).inc()

    def handlers(self) -> tuple[list[grpc.GenericRpcHandler], list[grpc.GenericRpcHandler]]:
        """The client listener's services (Produce, Consume, state, CollectStatus) and the
        internal listener's (manager, replication, state)."""

        def ser(msg) -> bytes:
            # A Produce stream's hot-path answers come serialized already (ProduceStream).
            return msg if isinstance(msg, bytes) else msg.SerializeToString()

        handler = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeHandlerService",
            {
                "Produce": grpc.stream_stream_rpc_method_handler(
                    self.produce, _tolerant(pb.ProduceRequest), ser
                ),
                "Consume": grpc.stream_stream_rpc_method_handler(
                    self.consume, _tolerant(pb.ConsumeRequest), ser
                ),
            },
        )
        manager = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeManagerService",
            {
                "Assign": grpc.unary_unary_rpc_method_handler(
                    self.assign, _tolerant(pb.StreamingNodeManagerAssignRequest), ser
                ),
                "Remove": grpc.unary_unary_rpc_method_handler(
                    self.remove, _tolerant(pb.StreamingNodeManagerRemoveRequest), ser
                ),
                "CollectStatus": grpc.unary_unary_rpc_method_handler(
                    self.collect_status, _tolerant(pb.StreamingNodeManagerCollectStatusRequest), ser
                ),
            },
        )
        state = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeStateService",
            {
                "GetComponentStates": grpc.unary_unary_rpc_method_handler(
                    self.component_states, _tolerant(milvus_pb2.GetComponentStatesRequest), ser
                )
            },
        )
        replication = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeReplicationService",
            {
                "Fetch": grpc.unary_stream_rpc_method_handler(
                    self.fetch, _tolerant(pb.FetchRequest), ser
                ),
                "Replicate": grpc.stream_stream_rpc_method_handler(
                    self.replicate, _tolerant(pb.ReplicaAck), ser
                ),
                "Fence": grpc.unary_unary_rpc_method_handler(
                    self.fence, _tolerant(pb.FenceRequest), ser
                ),
            },
        )
        batch = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeBatchService",
            {
                "Fence": grpc.unary_unary_rpc_method_handler(
                    self.fence_batch, _tolerant(pb.FenceBatchRequest), ser
                ),
                "Assign": grpc.unary_unary_rpc_method_handler(
                    self.assign_batch, _tolerant(pb.AssignBatchRequest), ser
                ),
                "Remove": grpc.unary_unary_rpc_method_handler(
                    self.remove_batch, _tolerant(pb.RemoveBatchRequest), ser
                ),
            },
        )
        # CollectStatus is read-only and clients ask it (a pchannel's end offset, Spark's
        # node discovery), so the client listener answers it too.
        status = grpc.method_handlers_generic_handler(
            "milvus.proto.streaming.StreamingNodeManagerService",
            {
                "CollectStatus": grpc.unary_unary_rpc_method_handler(
                    self.collect_status, _tolerant(pb.StreamingNodeManagerCollectStatusRequest), ser
                ),
            },
        )
        return [handler, state, status], [manager, state, replication, batch]

    # -- replication -------------------------------------------------------------------

    async def fetch(self, request, context):
        """Stored records from `from_offset` to the end at call time, whatever the fence:
        a fenced previous owner is exactly who a new owner copies from."""
        try:
            if isinstance(request, Malformed):
                raise InvalidArgument(request.reason)
            validation.fetch(request)
            ch = self.wal.channels.get(request.pchannel)
            if ch is None:
                raise ChannelNotExist(f"pchannel {request.pchannel!r} has no log on this node")
            await self.wal.ensure_verified(ch)
            if ch.damage:  # a copy of a damaged log would move the loss elsewhere, unseen
                raise DataLoss(
                    f"pchannel {request.pchannel!r} lost acknowledged records on this node: "
                    f"{ch.damage}"
                )
        except StreamingError as err:
            await _abort(context, err)
            return
        end = ch.committed_next
        if request.HasField("end_offset"):
            end = min(end, request.end_offset)
        yield pb.FetchResponse(
            log_end=end,
            term_history=[pb.TermStart(term=t, first_offset=o) for t, o in ch.meta.history],
        )
        position = request.from_offset
        while position < end:
            try:
                recs = self.wal.read(ch, position, READ_RECORDS, raw=True)
            except StreamingError as err:
                await _abort(context, err)
                return
            if not recs:
                break
            for base, value in recs:
                if base >= end:
                    return
                yield pb.FetchResponse(base_offset=base, record=value, log_end=end)
                position = base + records.peek(value)[2]

    async def replicate(self, request_iterator, context):
        """A follower's stream (replication.py): acks in, the leader's records out."""
        try:
            first = await anext(request_iterator, None)
            if first is None:
                return
            if isinstance(first, Malformed):
                raise InvalidArgument(first.reason)
            validation.replica_ack(first)
            if not self.serving:
                raise OnShutdown("node is shutting down")
            repl = self.wal.replication
            await repl.serve(repl.open_stream(first, context.write, "grpc"), request_iterator)
        except StreamingError as err:
            await _abort(context, err)

    async def fence(self, request, context):
        return await self._unary(request, context, self._fence_one)

    async def _fence_one(self, req: pb.FenceRequest) -> pb.FenceResponse:
        last_term, next_offset, commit, damage = await self.wal.fence(
            req.pchannel.name, req.pchannel.term
        )
        return pb.FenceResponse(
            last_term=last_term,
            next_offset=next_offset,
            commit_offset=commit,
            data_loss=damage,
        )

    # -- batches (the coord's fences, assigns and removes of a round, per node) ----------

    async def _batch(self, request, context, action) -> list[object]:
        """Run every item of a batch together; each answer or StreamingError in its place.
        An item not done within the call's deadline (less a margin to answer) is an
        error of its own, so one slow pchannel does not cost the others their answers."""
        if isinstance(request, Malformed):
            raise InvalidArgument(request.reason)
        if not self.serving:
            raise OnShutdown("node is shutting down")
        remaining = context.time_remaining()
        budget = None if remaining is None else max(0.0, remaining * 0.9 - BATCH_MARGIN_S)

        async def one(item):
            try:
                return await asyncio.wait_for(action(item), budget)
            except StreamingError as err:
                return err
            except TimeoutError:
                return Inner(f"{item.pchannel.name}: not done within the batch's deadline")

        return list(await asyncio.gather(*(one(item) for item in request.items)))

    async def fence_batch(self, request, context):
        try:
            done = await self._batch(request, context, self._fence_one)
        except StreamingError as err:
            await _abort(context, err)
            return None
        return pb.FenceBatchResponse(
            items=[
                pb.FenceBatchItem(error=d.to_proto())
                if isinstance(d, StreamingError)
                else pb.FenceBatchItem(response=d)
                for d in done
            ]
        )

    async def assign_batch(self, request, context):
        return await self._results(request, context, self._assign_one)

    async def remove_batch(self, request, context):
        return await self._results(request, context, self._remove_one)

    async def _results(self, request, context, action):
        try:
            done = await self._batch(request, context, action)
        except StreamingError as err:
            await _abort(context, err)
            return None
        return pb.BatchResults(
            items=[
                pb.BatchResult(error=d.to_proto())
                if isinstance(d, StreamingError)
                else pb.BatchResult()
                for d in done
            ]
        )

    # -- manager -----------------------------------------------------------------------

    async def _unary(self, request, context, action):
        try:
            if isinstance(request, Malformed):
                raise InvalidArgument(request.reason)
            if not self.serving:
                raise OnShutdown("node is shutting down")
            return await action(request)
        except StreamingError as err:
            await _abort(context, err)

    async def assign(self, request, context):
        return await self._unary(request, context, self._assign_one)

    async def _assign_one(
        self, req: pb.StreamingNodeManagerAssignRequest
    ) -> pb.StreamingNodeManagerAssignResponse:
        validation.assign(req)
        retention = req.retention if req.HasField("retention") else None
        await self.wal.assign(
            req.pchannel.name,
            req.pchannel.term,
            retention,
            req.catch_up_from,
            req.min_next_offset,
            req.replica_set if req.HasField("replica_set") else None,
            req.accept_data_loss,
        )
        return pb.StreamingNodeManagerAssignResponse()

    async def remove(self, request, context):
        return await self._unary(request, context, self._remove_one)

    async def _remove_one(
        self, req: pb.StreamingNodeManagerRemoveRequest
    ) -> pb.StreamingNodeManagerRemoveResponse:
        await self.wal.remove(req.pchannel.name, req.pchannel.term)
        return pb.StreamingNodeManagerRemoveResponse()

    async def collect_status(self, request, context):
        async def act(_req):
            resp = pb.StreamingNodeManagerCollectStatusResponse(
                server_id=self.node_id,
                wall_time_ms=time.time_ns() // 1_000_000,
                probe_port=self.probe_port,
            )
            for ch in self.wal.channels.values():
                if not ch.core.known or not ch.core.reported:
                    continue
                status = ch.core.status()
                status.producers = ch.producers
                status.consumers = ch.consumers
                status.unhealthy = self.wal.unhealthy(ch)
                resp.channels.append(status)
            return resp

        return await self._unary(request, context, act)

    async def component_states(self, request, context):
        code = milvus_pb2.Healthy if self.serving else milvus_pb2.Stopping
        info = milvus_pb2.ComponentInfo(nodeID=self.node_id, role="streamingnode", state_code=code)
        return milvus_pb2.ComponentStates(state=info, status=milvus_pb2.Status())

    # -- produce -----------------------------------------------------------------------

    async def produce(self, request_iterator, context):
        sink = GrpcProduceSink(context)
        try:
            header = _header(context, PRODUCER_HEADER, pb.CreateProducerRequest)
        except StreamingError as err:
            await sink.abort(err)
            return
        await self.serve_producer(header, request_iterator, sink)

    async def serve_producer(
        self,
        header: pb.CreateProducerRequest,
        requests: AsyncIterator | PushedRequests,
        sink: ProduceSink,
    ) -> None:
        """One Produce stream, whichever transport carries it (gRPC or the produce port)."""
        try:
            validation.producer_header(header)
            term = header.pchannel.term
            ch = self.wal.access(header.pchannel.name, term)
            name = header.producer_id
            last_sequence = self.wal.last_sequence(ch, name) if name else 0
            quorum = self.wal.replication.needs_quorum(ch, header.ack_level)
        except StreamingError as err:
            await sink.abort(err)
            return
        producer_id = next(self._ids)
        ch.producers += 1
        gauge = self.wal.metrics.active_producers.labels(ch.name)
        gauge.inc()
        try:
            await sink.write(
                pb.ProduceResponse(
                    create=pb.CreateProducerResponse(
                        producer_id=producer_id, last_sequence=last_sequence, answers_ping=True
                    )
                )
            )
            await ProduceStream(self, ch, term, name, quorum, requests, sink).run()
        finally:
            ch.producers -= 1
            gauge.dec()

    # -- consume -----------------------------------------------------------------------

    async def consume(self, request_iterator, context):
        try:
            header = _header(context, CONSUMER_HEADER, pb.CreateConsumerRequest)
            validation.consumer_header(header)
            term = header.pchannel.term
            ch = self.wal.access(header.pchannel.name, term)
            filters = delivery.Filters.from_proto(list(header.deliver_filters))
            position = delivery.start_offset(
                header.deliver_policy, ch.first_offset, ch.visible_next
            )
        except StreamingError as err:
            await _abort(context, err)
            return
        consumer_id = next(self._ids)
        ch.consumers += 1
        ticks = 0 if header.options.skip_time_ticks else 1
        self.wal.want_ticks(ch, ticks)
        self.wal.metrics.active_consumers.labels(ch.name).inc()
        closer = asyncio.ensure_future(self._await_close(request_iterator))
        try:
            await context.write(
                pb.ConsumeResponse(
                    create=pb.CreateConsumerResponse(
                        first_offset=ch.first_offset, next_offset=ch.visible_next
                    )
                )
            )
            err = await self._deliver(
                ch, term, position, filters, header.options, closer, context, consumer_id
            )
            if err is not None:
                await _abort(context, err)
            else:
                await context.write(pb.ConsumeResponse(close=pb.CloseConsumerResponse()))
        finally:
            closer.cancel()
            ch.consumers -= 1
            self.wal.want_ticks(ch, -ticks)
            ch.consumer_positions.pop(consumer_id, None)
            self.wal.metrics.active_consumers.labels(ch.name).dec()

    @staticmethod
    async def _await_close(request_iterator) -> StreamingError | None:
        """Ends when the client asks to close (None) or sends garbage (the error).

        A half-closed request stream only means "no more requests": delivery goes on
        until the client cancels or closes, so this then waits to be cancelled.
        """
        async for req in request_iterator:
            if isinstance(req, Malformed):
                return InvalidArgument(req.reason)
            if req.WhichOneof("request") == "close":
                return None
            return InvalidArgument("empty ConsumeRequest")
        await asyncio.Event().wait()
        return None

    async def _deliver(
        self,
        ch: Channel,
        term: int,
        position: int,
        filters: delivery.Filters,
        options: pb.ConsumerOptions,
        closer: asyncio.Future,
        context: aio.ServicerContext,
        consumer_id: int,
    ) -> StreamingError | None:
        lag = self.wal.metrics.consumer_lag.labels(ch.name)
        delivered = self.wal.metrics.delivered(ch.name)
        batched = options.batched
        skip_ticks = options.skip_time_ticks
        end = options.end_offset if options.HasField("end_offset") else None
        while True:
            if closer.done():
                return closer.result()
            if end is not None and position >= end:
                return None  # a bounded read is complete: close the stream
            try:
                ch.core.access(term)
            except StreamingError as err:
                return err
            if not self.serving:
                return OnShutdown("node is shutting down")
            try:
                recs = self.wal.read(ch, position, READ_RECORDS)
            except StreamingError as err:
                return err
            if not recs:
                waiter = asyncio.ensure_future(ch.wait_changed(1.0))
                await asyncio.wait((waiter, closer), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            small: list[delivery.Slice] = []  # small records of one term, sent as one frame
            small_term = 0
            for base, value in recs:
                try:
                    rec = records.decode(value, f"{ch.name}@{base}")
                except StreamingError as err:
                    self.wal.report_bad_record(ch, base, err.cause, "read")
                    if small:  # deliver everything before the bad record first
                        await context.write(delivery.batch_frame(delivery.join(small), small_term))
                    return err
                piece = delivery.select(base, rec, position, filters, end)
                position = base + rec.count
                if piece is None or (skip_ticks and rec.flags & records.FLAG_TIME_TICK):
                    continue
                if not rec.flags & records.FLAG_TIME_TICK:
                    delivered[0] += piece.count
                if not batched:
                    for frame in delivery.message_frames(piece, rec.term):
                        await context.write(frame)
                    continue
                if small and (rec.term != small_term or not delivery.joinable(small, piece)):
                    await context.write(delivery.batch_frame(delivery.join(small), small_term))
                    small = []
                if len(piece.body) >= delivery.JOIN_BYTES:
                    await context.write(delivery.batch_frame(piece, rec.term))
                else:
                    small.append(piece)
                    small_term = rec.term
            if small:
                await context.write(delivery.batch_frame(delivery.join(small), small_term))
            ch.consumer_positions[consumer_id] = position
            lag.set(ch.visible_next - min(ch.consumer_positions.values()))
