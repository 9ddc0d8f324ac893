"""The produce port: Produce streams over plain TCP frames (proto/wire.proto).

A thin adapter like the gRPC one: it turns frames into the requests `ProduceStream`
acts on and its answers into frames, and nothing else. It exists for latency: grpc.aio
passes every frame through a poller thread and back into the event loop on both sides,
which costs a one-at-a-time producer about half a millisecond per message on a small
machine (docs/decisions.md). For the same reason a connection is a protocol that parses
frames in `data_received` and hands each request to the stream there, not a reader
task woken per frame. With TLS configured the port stays closed: it has no transport
security of its own, and producers then use gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.errors import InvalidArgument, OnShutdown, StreamingError
from streamwal.node.produce_stream import Answer, Malformed, ProduceStream, PushedRequests
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.produce_port")


def _answer_frame(response: Answer) -> bytes:
    body = response if isinstance(response, bytes) else response.SerializeToString()
    return wire.frame(wire.PRODUCE_RESPONSE, body)


def _request(kind: int, body: bytes) -> pb.ProduceRequest | Malformed:
    """A frame after the header as the gRPC handler would see it: parsed, or Malformed."""
    if kind != wire.PRODUCE_REQUEST:
        return Malformed("produce port", ValueError(f"frame kind {kind} after the header"))
    try:
        return pb.ProduceRequest.FromString(body)
    except DecodeError as exc:
        return Malformed("ProduceRequest", exc)


class _Connection(wire.FramedProtocol, PushedRequests):
    """One producer's connection: its first frame is the header, the rest requests.

    Frames are cut as bytes arrive. Until the stream is attached (the header checked and
    answered), and whenever the stream's in-flight window is full, the connection holds
    the frames it has not handed over and stops reading the socket, so a producer that
    outruns the disk is slowed by TCP instead of growing the node's memory.
    """

    def __init__(self, port: ProducePort) -> None:
        super().__init__(port.limit)
        self._port = port
        self._header: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stream: ProduceStream | None = None
        self._done = False  # the stream ended or the input did: hand over nothing more
        self._eof = False
        self._space_task: asyncio.Task | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._port.opened(asyncio.ensure_future(self._serve()))

    def data_received(self, data: bytes) -> None:
        if self._done:
            return  # the stream is over; the connection closes once its answers are out
        self.cutter.feed(data)
        self._pump()

    def eof_received(self) -> bool:
        self._eof = True
        self._pump()
        return True  # keep our side open: answers (and an error) may still be due

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._eof = True
        self._pump()

    # -- PushedRequests --------------------------------------------------------------

    def attach(self, stream: ProduceStream) -> None:
        self._stream = stream
        self._pump()

    # -- frames in ------------------------------------------------------------------

    def _held(self) -> bool:
        """Whether frames must wait: the header is taken but no stream is attached yet,
        or the stream's window is full."""
        if self._stream is None:
            return self._header.done()
        return self._stream.window_full

    def _pump(self) -> None:
        """Hand over every whole frame the stream may take now; pause or resume reading."""
        while not self._done and not self._held():
            try:
                got = self.cutter.next()
                if got is None and self._eof:
                    self.cutter.check_ended()
            except wire.FrameError as exc:
                self._take_error(exc)
                break
            if got is None:
                if self._eof:
                    self._take_end()
                break
            self._take(*got)
        self._flow()

    def _take(self, kind: int, body: bytes) -> None:
        if self._stream is None:
            self._header.set_result((kind, body))
        elif not self._stream.receive(_request(kind, body)):
            self._done = True

    def _take_error(self, exc: wire.FrameError) -> None:
        self._done = True
        if self._stream is None:
            if not self._header.done():
                self._header.set_exception(exc)
        else:
            self._stream.receive(Malformed("produce port", exc))

    def _take_end(self) -> None:
        self._done = True
        if self._stream is None:
            if not self._header.done():
                self._header.set_result(None)
        else:
            self._stream.finish()

    def _flow(self) -> None:
        held = not self._done and self._held()
        self.hold_reading(held)
        if held and not self.lost and self._stream is not None and self._space_task is None:
            self._space_task = asyncio.ensure_future(self._await_space(self._stream))

    async def _await_space(self, stream: ProduceStream) -> None:
        while stream.window_full:
            stream.space.clear()
            await stream.space.wait()
        self._space_task = None
        self._pump()

    # -- answers out ----------------------------------------------------------------

    async def write(self, response: Answer) -> None:
        self.transport.write(_answer_frame(response))
        await self.drain()

    def write_now(self, response: Answer) -> bool:
        if not self.can_write_now():
            return False  # a slow reader's backlog: `write` waits for it to drain
        self.transport.write(_answer_frame(response))
        return True

    async def abort(self, err: StreamingError) -> None:
        self.transport.write(wire.frame(wire.ERROR, err.to_proto().SerializeToString()))
        with contextlib.suppress(ConnectionError):
            await self.drain()
        self.transport.close()

    # -- the stream -----------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            header = await self._read_header()
            if header is not None:
                await self._port.service.serve_producer(header, self, self)
        except ConnectionError:
            pass  # the producer went away; what it was not answered it never had acked
        except asyncio.CancelledError:
            if not self._port.stopping:
                raise
            # cut off by stop() after the grace period, as gRPC cancels its late RPCs
        finally:
            self._done = True
            if self._space_task is not None:
                self._space_task.cancel()
            self.transport.close()

    async def _read_header(self) -> pb.CreateProducerRequest | None:
        try:
            got = await self._header
        except wire.FrameError as exc:
            await self.abort(InvalidArgument(f"malformed produce port frame: {exc}"))
            return None
        if got is None:
            return None
        kind, body = got
        if not self._port.service.serving:
            await self.abort(OnShutdown("node is shutting down"))
            return None
        if kind != wire.CREATE_PRODUCER:
            await self.abort(
                InvalidArgument(f"the first frame must be CREATE_PRODUCER, not {kind}")
            )
            return None
        try:
            return pb.CreateProducerRequest.FromString(body)
        except DecodeError as exc:
            await self.abort(InvalidArgument(f"garbled CreateProducerRequest: {exc}"))
            return None


class ProducePort:
    """Listens next to the gRPC server; every connection is one Produce stream."""

    def __init__(self, service, frame_limit: int) -> None:
        self.service = service
        self.limit = frame_limit
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.stopping = False
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def opened(self, task: asyncio.Task) -> None:
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def stop(self, grace: float) -> None:
        """Stop accepting; give open streams `grace` seconds to finish, then cut them."""
        if self._server is None:
            return
        self.stopping = True
        self._server.close()
        if self._connections:
            _, late = await asyncio.wait(self._connections, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        self._server = None
