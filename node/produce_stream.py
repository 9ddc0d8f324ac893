"""One Produce stream over the Wal, independent of the transport that carries it.

The gRPC handler and the produce port (node/produce_port.py) both hand their parsed
requests and a sink for the answers to `ProduceStream`, so fencing, batching, flow
control, txns and idempotence are the same code whichever way a producer connects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from streamwal.errors import Inner, InvalidArgument, StreamingError
from streamwal.ids import encode_offset
from streamwal.node import txn_ops, validation
from streamwal.node.channel import Channel
from streamwal.node.wal import Resent
from streamwal.proto import streaming_pb2 as pb
from streamwal.protowire import produce_batch_answer

if TYPE_CHECKING:
    from streamwal.node.service import NodeService

log = logging.getLogger("streamwal.node.produce")


class Malformed:
    """Stands in for a request frame that did not parse."""

    def __init__(self, what: str, exc: Exception) -> None:
        self.reason = f"malformed {what} frame: {exc}"


# A ProduceResponse, or one already serialized (the hot path's answers are hand-encoded).
Answer = pb.ProduceResponse | bytes
_PONG = pb.ProduceResponse(pong=pb.ProducePong()).SerializeToString()


class ProduceSink(Protocol):
    """Where a Produce stream's answers go: in order, then maybe an error that ends it."""

    async def write(self, response: Answer) -> None: ...

    def write_now(self, response: Answer) -> bool:
        """Hand `response` to the transport at once if it takes it without waiting; False
        leaves it to `write` (called from the stream's writer task)."""
        ...

    async def abort(self, err: StreamingError) -> None: ...


class PushedRequests:
    """A transport that parses requests in its own callbacks and hands each to the
    stream's `receive` at once, instead of being read by a task (node/produce_port.py)."""

    def attach(self, stream: ProduceStream) -> None:
        """Start handing requests to `stream` (and `finish` at their end)."""
        raise NotImplementedError


class ProduceStream:
    """One Produce stream: reads requests, appends them, answers in completion order."""

    def __init__(
        self,
        svc: NodeService,
        ch: Channel,
        term: int,
        producer_name: str,
        quorum: bool,
        requests: AsyncIterator | PushedRequests,
        sink: ProduceSink,
    ) -> None:
        self.svc = svc
        self.quorum = quorum  # answer once committed on a quorum, not once synced here
        self.producer_name = producer_name
        self.ch = ch
        self.term = term
        self.requests = requests
        self.sink = sink
        self.out: asyncio.Queue = asyncio.Queue()
        self.outstanding = 0
        # Set once the end of the stream (close, half-close, error) is queued: from then
        # on every answer goes through `out`, so none can overtake the end.
        self.ending = False
        self.inflight_bytes = 0
        self.space = asyncio.Event()

    async def run(self) -> None:
        reader = None
        if isinstance(self.requests, PushedRequests):
            self.requests.attach(self)
        else:  # gRPC's request iterator
            reader = asyncio.ensure_future(self._read())
        closing: StreamingError | bool | None = None  # True: close requested
        try:
            while True:
                if closing is not None and self.outstanding == 0:
                    break
                item = await self.out.get()
                if isinstance(item, (bytes, pb.ProduceResponse)):
                    self.outstanding -= 1
                    self.space.set()
                    await self.sink.write(item)
                else:
                    closing = item
            if isinstance(closing, StreamingError):
                await self.sink.abort(closing)
            elif closing is True:
                await self.sink.write(pb.ProduceResponse(close=pb.CloseProducerResponse()))
        finally:
            if reader is not None:
                reader.cancel()
            self.ending = True  # a transport that still pushes is answered by nobody
            self.svc.txns.drop_owner(self)  # a txn lives no longer than its stream

    async def _read(self) -> None:
        try:
            async for req in self.requests:
                if not self.receive(req):
                    return
                if self.window_full:
                    self.svc.count_limit(self.full_limit)
                while self.window_full:
                    self.space.clear()
                    await self.space.wait()
            self.finish()  # half-closed without a close request
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke; nothing more to answer
            log.debug("producer stream ended", extra={"error": repr(exc)})
            self.finish()

    def receive(self, req: pb.ProduceRequest | Malformed) -> bool:
        """Act on one request; False once it ended the stream (close, bad request), after
        which the transport must pass no more."""
        if self.ending:
            return False
        if isinstance(req, Malformed):
            self._end(InvalidArgument(req.reason))
            return False
        kind = req.WhichOneof("request")
        try:
            if kind == "produce_batch":
                self._batch(req.produce_batch)
            elif kind == "produce":
                self._single(req.produce)
            elif kind == "txn":
                txn_ops.handle(self, req.txn)
            elif kind == "ping":  # the producer checks that this node still answers
                self.outstanding += 1
                self.answer(_PONG)
            elif kind == "close":
                self._end(True)
                return False
            else:
                self._end(InvalidArgument("empty ProduceRequest"))
                return False
        except Exception as exc:  # a bug: end this stream with an error, never silently
            log.exception("produce request failed", extra={"pchannel": self.ch.name})
            self._end(Inner(f"the node failed on a {kind} request: {exc!r}"))
            return False
        return True

    @property
    def window_full(self) -> bool:
        """Over the in-flight bytes, or over the answers waiting to be written (a producer
        that does not read them): the transport should stop reading (`space` is set as
        answers free it)."""
        return (
            self.inflight_bytes > self.svc.max_inflight
            or self.outstanding >= self.svc.max_pending_answers
        )

    @property
    def full_limit(self) -> str:
        """Which limit a full window is at (node/limits.py)."""
        return (
            "producer_window" if self.inflight_bytes > self.svc.max_inflight else "pending_answers"
        )

    def finish(self) -> None:
        """The producer sent nothing more (half-close, or the connection is gone)."""
        if not self.ending:
            self._end(False)

    def close(self) -> None:
        """The transport closes the stream as a close request would (answered with a
        close): an idle producer's stream on the produce port."""
        if not self.ending:
            self._end(True)

    def fail(self, err: StreamingError) -> None:
        """The transport ends the stream with `err` (a limit, a broken frame)."""
        if not self.ending:
            self._end(err)

    def _end(self, item: StreamingError | bool) -> None:
        self.ending = True
        self.out.put_nowait(item)

    def answer(self, response: Answer) -> None:
        """Send one answer for a request counted in `outstanding`.

        Written straight to the transport when nothing is queued before it: a lone
        producer's answer then leaves in the callback that made the write durable,
        without waking the writer task (a task switch per message, ~10 % of the node's
        CPU per one-at-a-time send).
        """
        if not self.ending and self.out.empty() and self.sink.write_now(response):
            self.outstanding -= 1
            return
        self.out.put_nowait(response)

    def _submit(
        self,
        body: bytes,
        count: int,
        respond: Callable[[int, int, bool], Answer],
        fail: Callable[[StreamingError], pb.ProduceResponse],
        producer: tuple[str, int] | None = None,
        barrier_time_tick: int = 0,
        flags: int = 0,
    ) -> None:
        """Append and answer once durable (and committed, at QUORUM): respond(base, first
        tick, duplicate) or fail."""
        self.outstanding += 1
        duplicate = False
        size = len(body)

        def answer(exc: BaseException | None, base: int = 0, first_tick: int = 0) -> None:
            self.inflight_bytes -= size
            self.space.set()
            if exc is None:
                self.answer(respond(base, first_tick, duplicate))
            else:
                err = exc if isinstance(exc, StreamingError) else Inner(str(exc))
                self.answer(fail(err))

        def durable(f: asyncio.Future) -> None:
            exc = f.exception()
            if exc is not None:
                return answer(exc)
            base, first_tick = f.result()
            if not self.quorum:
                return answer(None, base, first_tick)
            committed = self.svc.wal.replication.wait_commit(self.ch, self.term, base + count)
            committed.add_done_callback(lambda c: answer(c.exception(), base, first_tick))

        try:
            self.svc.wal.append(
                self.ch,
                self.term,
                body,
                count,
                producer=producer,
                barrier_time_tick=barrier_time_tick,
                flags=flags,
                on_done=durable,
            )
        except StreamingError as err:
            self.answer(fail(err))
            return
        except Resent as resent:
            r = resent.result
            duplicate, count = True, r.count
            pending = resent.pending
            if pending is None:  # durable long ago: answer with the original's result
                pending = asyncio.get_running_loop().create_future()
                pending.set_result((r.base, r.first_tick))
            pending.add_done_callback(durable)
        self.inflight_bytes += size

    def _batch(self, req: pb.ProduceBatchRequest) -> None:
        rid = req.request_id

        def fail(err: StreamingError) -> pb.ProduceResponse:
            return pb.ProduceResponse(
                produce_batch=pb.ProduceBatchResponse(request_id=rid, error=err.to_proto())
            )

        try:
            count = len(validation.batch(req.messages, self.svc.max_message_bytes).messages)
        except StreamingError as err:
            self.outstanding += 1
            self.answer(fail(err))
            return

        def respond(base: int, first_tick: int, duplicate: bool) -> bytes:
            return produce_batch_answer(rid, base, count, first_tick, duplicate)

        producer = (
            (self.producer_name, req.sequence) if self.producer_name and req.sequence else None
        )
        self._submit(req.messages, count, respond, fail, producer, req.barrier_time_tick)

    def _single(self, req: pb.ProduceMessageRequest) -> None:
        rid = req.request_id

        def fail(err: StreamingError) -> pb.ProduceResponse:
            return pb.ProduceResponse(
                produce=pb.ProduceMessageResponse(request_id=rid, error=err.to_proto())
            )

        try:
            validation.message(req.message, self.svc.max_message_bytes)
        except StreamingError as err:
            self.outstanding += 1
            self.answer(fail(err))
            return

        def respond(base: int, first_tick: int, _duplicate: bool) -> pb.ProduceResponse:
            return pb.ProduceResponse(
                produce=pb.ProduceMessageResponse(
                    request_id=rid,
                    result=pb.ProduceMessageResponseResult(
                        id=pb.MessageID(id=encode_offset(base)), time_tick=first_tick
                    ),
                )
            )

        body = pb.MessageBatch(messages=[req.message]).SerializeToString()
        self._submit(body, 1, respond, fail)
