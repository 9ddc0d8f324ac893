"""The client end of the node's produce port (proto/wire.proto).

`WireProduceCall` offers the part of a grpc.aio stream call that `Producer` uses
(write, read, done_writing, cancel), so the producer's batching, pipelining, resend and
error handling are one code path over either transport. Errors come as StreamingErrors
(the node's own, from its ERROR frame) or as Unavailable when the connection breaks.
"""

from __future__ import annotations

import asyncio
import contextlib

from grpc import aio

from streamwal import wire
from streamwal.errors import InvalidRequestSeq, StreamingError, Unavailable
from streamwal.proto import streaming_pb2 as pb

CONNECT_TIMEOUT_S = 1.0  # a port that neither answers nor refuses is treated as closed


class WireProduceCall:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def write(self, request: bytes) -> None:
        """Send one serialized ProduceRequest."""
        self._writer.write(wire.frame(wire.PRODUCE_REQUEST, request))
        await self._writer.drain()

    def can_write_now(self) -> bool:
        """Whether a frame written now goes out at once (nothing buffered before it)."""
        transport = self._writer.transport
        return not transport.is_closing() and not transport.get_write_buffer_size()

    def write_now(self, request: bytes) -> None:
        """Send one serialized ProduceRequest without waiting (see `can_write_now`)."""
        self._writer.write(wire.frame(wire.PRODUCE_REQUEST, request))

    async def read(self) -> pb.ProduceResponse:
        """The next answer, or aio.EOF once the node closed the stream."""
        try:
            got = await wire.read_frame(self._reader)
        except (wire.FrameError, ConnectionError) as exc:
            raise Unavailable(f"produce port connection broke: {exc}") from None
        if got is None:
            return aio.EOF
        kind, body = got
        if kind == wire.PRODUCE_RESPONSE:
            return pb.ProduceResponse.FromString(body)
        if kind == wire.ERROR:
            raise StreamingError.from_proto(pb.StreamingError.FromString(body))
        raise Unavailable(f"the node sent frame kind {kind} on a produce stream")

    async def done_writing(self) -> None:
        with contextlib.suppress(OSError):  # the node is gone already: nothing to tell it
            self._writer.write_eof()

    def cancel(self) -> None:
        self._writer.close()


async def open_wire_producer(
    host: str, port: int, header: pb.CreateProducerRequest
) -> tuple[WireProduceCall, pb.ProduceResponse]:
    """Connect, send the header, return (call, the node's `create` answer).

    OSError / TimeoutError: the port cannot be reached (the caller may use gRPC).
    StreamingError: the node refused the producer (the same error gRPC would give).
    """
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, limit=2 * 1024 * 1024), CONNECT_TIMEOUT_S
    )
    call = WireProduceCall(reader, writer)
    try:
        writer.write(wire.frame(wire.CREATE_PRODUCER, header.SerializeToString()))
        await writer.drain()
        got = await wire.read_frame(reader)
        if got is None or got[0] not in (wire.PRODUCE_RESPONSE, wire.ERROR):
            raise ConnectionError("no produce port answer on that port")
        kind, body = got
        if kind == wire.ERROR:
            raise StreamingError.from_proto(pb.StreamingError.FromString(body))
        first = pb.ProduceResponse.FromString(body)
        if first.WhichOneof("response") != "create":
            raise InvalidRequestSeq("the node did not answer the producer header with `create`")
    except wire.FrameError as exc:
        call.cancel()
        raise ConnectionError(f"not a produce port: {exc}") from None
    except BaseException:
        call.cancel()
        raise
    return call, first
