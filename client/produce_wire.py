"""The produce port's implementation of the produce-call protocol (client/produce_call.py).

The node's produce port carries the Produce stream's messages as plain TCP frames
(proto/wire.proto). Answers are not read by a task: the connection is a protocol that
cuts frames in `data_received` and hands each answer to the producer's callback there, so
a one-at-a-time send's answer wakes only the sender, not a reader task first; and a
request may be written at once (`write_now`) when nothing is buffered before it. Errors
come as StreamingErrors (the node's own, from its ERROR frame) or as Unavailable when the
connection breaks.
"""

from __future__ import annotations

import asyncio
import contextlib

from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.client import encoding
from streamwal.client.produce_call import OnAnswer, OnEnd
from streamwal.errors import InvalidRequestSeq, StreamingError, Unavailable
from streamwal.proto import streaming_pb2 as pb

CONNECT_TIMEOUT_S = 1.0  # a port that neither answers nor refuses is treated as closed
# A request whose parts average under this many bytes is joined and written as one
# string: many small entries cost less copied than handed to the kernel one by one.
JOIN_PART_BYTES = 1024


class WireProduceCall(wire.FramedProtocol):
    """One producer's connection to a produce port (a ProduceCall once `create` arrived)."""

    transport_name = "produce port"

    def __init__(self) -> None:
        super().__init__()
        self.first: asyncio.Future = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.create = pb.CreateProducerResponse()
        self.heard = False
        self._on_answer: OnAnswer | None = None
        self._on_end: OnEnd | None = None
        self._end_error: StreamingError | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        self.heard = True
        self.cutter.feed(data)
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.eof and exc is not None:  # broke before the node ended its side
            self._end_error = Unavailable(f"produce port connection broke: {exc}")
        super().connection_lost(exc)
        self._pump()

    # -- answers in -----------------------------------------------------------------

    def listen(self, on_answer: OnAnswer, on_end: OnEnd) -> None:
        """Hand every answer after `first` to `on_answer`, then the end to `on_end`
        (`ended` is done once the stream is over)."""
        self._on_answer, self._on_end = on_answer, on_end
        self._pump()

    def _pump(self) -> None:
        while not self.ended.done():
            if self.first.done() and self._on_answer is None:
                self.hold_reading(True)  # answers wait for `listen`
                return
            try:
                got = self.next_frame()
            except wire.FrameError as exc:
                self._end(Unavailable(f"produce port connection broke: {exc}"))
                return
            if got is None:
                if self.eof:
                    self._end(self._end_error)
                break
            self._take(*got)
        self.hold_reading(False)

    def _take(self, kind: int, body: memoryview) -> None:
        try:
            if kind == wire.ERROR:
                self._end(StreamingError.from_proto(pb.StreamingError.FromString(body)))
                return
            if kind != wire.PRODUCE_RESPONSE:
                self._end(Unavailable(f"the node sent frame kind {kind} on a produce stream"))
                return
            answer = pb.ProduceResponse.FromString(body)
        except DecodeError as exc:
            self._end(Unavailable(f"garbled answer on the produce port: {exc}"))
            return
        if not self.first.done():
            self.first.set_result(answer)
        elif not self._on_answer(answer):
            self._end(None)

    def _end(self, err: StreamingError | None) -> None:
        if not self.first.done():
            # Before the `create` answer only the node's own refusal is a StreamingError;
            # anything else means no produce port answers here (OSError: use gRPC).
            if not isinstance(err, StreamingError) or isinstance(err, Unavailable):
                reason = f": {err}" if err is not None else ""
                err = ConnectionError(f"no produce port answer on that port{reason}")
            self.first.set_exception(err)
        elif self._on_end is not None:
            self._on_end(err)
        if not self.ended.done():  # (cancelled by a producer that stopped waiting)
            self.ended.set_result(None)

    # -- requests out ---------------------------------------------------------------

    def send_header(self, header: pb.CreateProducerRequest) -> None:
        self.transport.write(wire.frame(wire.CREATE_PRODUCER, header.SerializeToString()))

    async def write(self, request: list[bytes]) -> None:
        """Send one serialized ProduceRequest (`request_parts`)."""
        self.write_now(request)
        await self.drain()

    def write_now(self, request: list[bytes]) -> None:
        """Send one serialized ProduceRequest without waiting (see `can_write_now`).

        A request of large parts goes out as them (a vectored write, nothing copied: a
        batch's entries are its parts); others as one string, one plain write."""
        size = sum(map(len, request))
        if size < JOIN_PART_BYTES * len(request):
            self.transport.write(b"".join([wire.head(wire.PRODUCE_REQUEST, size), *request]))
        else:
            self.transport.writelines([wire.head(wire.PRODUCE_REQUEST, size), *request])

    async def close(self, timeout: float) -> None:
        """Send `close`, half-close, and wait (at most `timeout` s) for the node's end."""
        if self.lost or self.transport.is_closing():
            return  # the node is gone already: nothing to tell it
        self.transport.write(wire.frame(wire.PRODUCE_REQUEST, encoding.close_frame()))
        with contextlib.suppress(OSError):
            self.transport.write_eof()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.ended), timeout)

    def cancel(self) -> None:
        """Drop the connection at once, with whatever is still unsent (a paused node would
        never read it, and a closing transport would wait for it)."""
        self.transport.abort()


async def open_wire_producer(
    host: str, port: int, header: pb.CreateProducerRequest
) -> WireProduceCall:
    """Connect, send the header, return the call once the node answered `create`.

    OSError / TimeoutError: the port cannot be reached, or what answers there is not a
    produce port (the caller may use gRPC).
    StreamingError: the node refused the producer (the same error gRPC would give).
    """
    loop = asyncio.get_running_loop()
    _, call = await asyncio.wait_for(
        loop.create_connection(WireProduceCall, host, port), CONNECT_TIMEOUT_S
    )
    try:
        call.send_header(header)
        first = await call.first
        if first.WhichOneof("response") != "create":
            raise InvalidRequestSeq("the node did not answer the producer header with `create`")
    except BaseException:
        call.cancel()
        raise
    call.create = first.create
    return call
