"""One produce-call protocol, two implementations: gRPC's Produce stream and the node's
produce port (client/produce_wire.py).

`ProduceCall` is all the producer loop (client/producer.py) knows of a transport: write
serialized ProduceRequests (at once when the transport takes them without waiting, else
awaiting room), hand every answer to a callback and the end once, say whether anything
arrived (`heard`, for the liveness bounds), and close gracefully within a bound or at once.
Both carry the same ProduceRequest / ProduceResponse messages, serialized by
`request_parts` (a request as the byte strings to write one after another), so batching,
sequence numbers, resends and the liveness checks are one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

import grpc
from grpc import aio

from streamwal.client import encoding
from streamwal.client.node_streams import open_stream
from streamwal.client.produce_ledger import Batch, Op, TxnOp
from streamwal.errors import StreamingError, Unavailable
from streamwal.grpc_errors import from_rpc_error
from streamwal.proto import streaming_pb2 as pb

# Takes one answer; False once the producer wants no more (its stream is over).
OnAnswer = Callable[[pb.ProduceResponse], bool]
# Told once how the stream ended: None for a clean close by the node.
OnEnd = Callable[[StreamingError | None], None]

PING = pb.ProduceRequest(ping=pb.ProducePing()).SerializeToString()


def request_parts(op: Op) -> list[bytes]:
    """The serialized ProduceRequest of a dispatched ledger op, as parts whose
    concatenation it is (a batch's entries are parts, uncopied)."""
    if isinstance(op, Batch):
        return encoding.produce_batch_parts(op.request_id, op.entries, op.sequence, op.barrier)
    assert isinstance(op, TxnOp)
    request: pb.TxnRequest = op.request
    request.request_id = op.request_id
    if op.commit:
        request.commit.sequence = op.sequence
    return [pb.ProduceRequest(txn=request).SerializeToString()]


class ProduceCall(Protocol):
    """An open Produce stream to one node, after its `create` answer."""

    transport_name: str  # "gRPC" or "produce port"
    create: pb.CreateProducerResponse  # the node's answer to the header
    heard: bool  # set whenever something arrives; the loop clears it

    def listen(self, on_answer: OnAnswer, on_end: OnEnd) -> None:
        """Hand every answer to `on_answer` as it arrives, then the end to `on_end`."""
        ...

    def can_write_now(self) -> bool:
        """Whether `write_now` may be used: the frame goes out at once, nothing before it."""
        ...

    def write_now(self, request: list[bytes]) -> None: ...

    async def write(self, request: list[bytes]) -> None:
        """Send one request (`request_parts`), waiting while the transport holds too much
        already."""
        ...

    async def close(self, timeout: float) -> None:
        """Ask the node to end the stream and wait (at most `timeout` s) until it has."""
        ...

    def cancel(self) -> None:
        """Drop the stream at once (nothing more is sent or handed over)."""
        ...


class GrpcProduceCall:
    """The Produce stream over gRPC; answers are read by a task."""

    transport_name = "gRPC"

    def __init__(self, call: aio.StreamStreamCall, create: pb.CreateProducerResponse) -> None:
        self._call = call
        self.create = create
        self.heard = False
        self._reader: asyncio.Task | None = None

    def listen(self, on_answer: OnAnswer, on_end: OnEnd) -> None:
        self._reader = asyncio.ensure_future(self._read(on_answer, on_end))

    async def _read(self, on_answer: OnAnswer, on_end: OnEnd) -> None:
        try:
            while True:
                resp = await self._call.read()
                self.heard = True
                if resp is aio.EOF or not on_answer(resp):
                    break
            on_end(None)
        except grpc.RpcError as exc:
            on_end(from_rpc_error(exc))

    def can_write_now(self) -> bool:
        return False  # grpc.aio writes through its own poller: always awaited

    def write_now(self, request: list[bytes]) -> None:
        raise NotImplementedError("gRPC writes are awaited (can_write_now is False)")

    async def write(self, request: list[bytes]) -> None:
        await self._call.write(b"".join(request))

    async def close(self, timeout: float) -> None:
        with contextlib.suppress(
            grpc.RpcError, StreamingError, TimeoutError, asyncio.InvalidStateError
        ):
            # InvalidStateError: the RPC ended before the reader noticed (nothing to say)
            await asyncio.wait_for(self._close(), timeout)

    async def _close(self) -> None:
        await self._call.write(encoding.close_frame())
        await self._call.done_writing()
        if self._reader is not None:
            await asyncio.shield(self._reader)

    def cancel(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self._call.cancel()


async def open_grpc_call(channel: aio.Channel, header: pb.CreateProducerRequest) -> GrpcProduceCall:
    """Open the Produce stream; raises the node's refusal as a StreamingError."""
    # Frames are encoded by hand (client/encoding.py): the serializer passes bytes on.
    call, first = await open_stream(channel, "Produce", header, pb.ProduceResponse, _as_is)
    return GrpcProduceCall(call, first.create)


def _as_is(raw: bytes) -> bytes:
    return raw


def unavailable(exc: BaseException) -> StreamingError:
    """A transport's exception as the StreamingError the producer reports."""
    if isinstance(exc, StreamingError):
        return exc
    if isinstance(exc, grpc.RpcError):
        return from_rpc_error(exc)
    return Unavailable(f"produce stream broke: {exc!r}")
