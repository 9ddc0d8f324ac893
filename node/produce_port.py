"""The produce port: Produce streams over plain TCP frames (proto/wire.proto).

A thin adapter like the gRPC one: it turns frames into the requests `ProduceStream`
acts on and its answers into frames, and nothing else. It exists for latency: grpc.aio
passes every frame through a poller thread and back into the event loop on both sides,
which costs a one-at-a-time producer about half a millisecond per message on a small
machine (docs/decisions.md). For the same reason a connection is a protocol that parses
frames in `data_received` and hands each request to the stream there, not a reader
task woken per frame. With TLS configured the port stays closed: it has no transport
security of its own, and producers then use gRPC.

Its limits (node/limits.py): connections in total and per peer address (a connection
over them gets its RESOURCE_EXHAUSTED and is closed at once), the largest frame (refused
from its header, before any of its body is read), the bytes of frames still arriving on
all connections together, a new connection's header timeout and every connection's idle
timeout (checked by one watcher task; a frame handed over or an answer written is
progress; an idle producer's stream is closed cleanly, the others are refused). The
stream's own window (bytes and answers in flight) pauses reading.
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.errors import InvalidArgument, OnShutdown, StreamingError
from streamwal.node import plain_port
from streamwal.node.config import NodeConfig
from streamwal.node.limits import LimitExceeded, ReceiveBuffer
from streamwal.node.produce_stream import Answer, Malformed, ProduceStream, PushedRequests
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.produce_port")

CLOSE_GRACE_S = plain_port.CLOSE_GRACE_S


def _answer_frame(response: Answer) -> bytes:
    body = response if isinstance(response, bytes) else response.SerializeToString()
    return wire.frame(wire.PRODUCE_RESPONSE, body)


def _request(kind: int, body: memoryview) -> pb.ProduceRequest | Malformed:
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
        super().__init__(port.config.max_frame_bytes)
        self._port = port
        loop = asyncio.get_running_loop()
        self._header: asyncio.Future = loop.create_future()
        self._stream: ProduceStream | None = None
        self._done = False  # the stream ended or the input did: hand over nothing more
        self._space_task: asyncio.Task | None = None
        self._closing = False  # our side is closed (or closing): nothing more is written
        self._refused = False
        self.peer = ""  # the peer's address, once counted against the connection limits
        self.opened_at = loop.time()
        self.progress = 0  # frames handed over and answers written: the idle watch
        self.charged = 0  # bytes held in the cutter, charged to the port's receive buffer

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        try:
            self._port.admit(self, str(peer[0]) if isinstance(peer, tuple) else str(peer))
        except LimitExceeded as err:
            self._done = True
            self.refuse(err)
            return
        self._port.opened(asyncio.ensure_future(self._serve()))

    def data_received(self, data: bytes) -> None:
        if self._done:
            return  # the stream is over; the connection closes once its answers are out
        self.cutter.feed(data)
        self._pump()

    def eof_received(self) -> bool:
        super().eof_received()
        # Keep our side open while answers (and an error) may still be due; once ours is
        # closed too (`close`), the connection is over.
        return not self._closing

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._pump()
        self._port.closed(self)

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
                got = plain_port.next_frame(self, "produce port")
            except StreamingError as err:
                self._take_error(err)
                break
            if got is None:
                if self.eof:
                    self._take_end()
                break
            self._take(*got)
        held = self.cutter.buffered() if not self._done else 0
        try:
            self.charged = plain_port.charge(self._port.buffer, self.charged, held)
        except LimitExceeded as err:
            self._take_error(err)
        self._flow()

    def _take(self, kind: int, body: memoryview) -> None:
        self.progress += 1
        if self._stream is None:
            self._header.set_result((kind, body))
        elif not self._stream.receive(_request(kind, body)):
            self._done = True

    def _take_error(self, err: StreamingError) -> None:
        """End the stream (or refuse the header) with `err`; read nothing more."""
        self._done = True
        self._port.service.count_limit(err)
        if self._stream is None:
            if not self._header.done():
                self._header.set_exception(err)
        else:
            self._stream.fail(err)

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
            self._port.service.count_limit(self._stream.full_limit)
            self._space_task = asyncio.ensure_future(self._await_space(self._stream))

    async def _await_space(self, stream: ProduceStream) -> None:
        while stream.window_full:
            stream.space.clear()
            await stream.space.wait()
        self._space_task = None
        self._pump()

    # -- answers out ----------------------------------------------------------------

    async def write(self, response: Answer) -> None:
        if self._closing:
            raise ConnectionResetError("the connection is closing")
        self.transport.write(_answer_frame(response))
        await self.drain()
        self.progress += 1

    def write_now(self, response: Answer) -> bool:
        if self._closing or not self.can_write_now():
            return False  # a slow reader's backlog: `write` waits for it to drain
        self.transport.write(_answer_frame(response))
        self.progress += 1
        return True

    async def abort(self, err: StreamingError) -> None:
        if not self._closing:
            self.transport.write(wire.frame(wire.ERROR, err.to_proto().SerializeToString()))
        self.close()

    def refuse(self, err: StreamingError) -> None:
        """Send `err` and close, whatever the stream is doing (a limit was reached); the
        connection is gone CLOSE_GRACE_S later at most."""
        self._port.service.count_limit(err)
        self._refused = True
        if not self._closing:
            self.transport.write(wire.frame(wire.ERROR, err.to_proto().SerializeToString()))
        self.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)

    def close(self) -> None:
        """Close our side once what is written went out, and read (and drop) what the peer
        still sends until it closes too: closing a socket with unread input resets the
        connection, and the peer can lose our last frames (an error) with it. A peer that
        never closes is cut by the idle watch."""
        if self._closing:
            return
        self._closing = self._done = True
        self.hold_reading(False)
        if self.eof or not self.transport.can_write_eof():
            self.transport.close()
        else:
            self.transport.write_eof()

    def check_timeouts(self, now: float, seen: int, quiet_since: float) -> float:
        """Refuse the connection if it is past its header or idle timeout; returns since
        when it has been quiet (`seen`, `quiet_since`: its progress at the last check)."""
        cfg = self._port.config
        if self._refused:
            return quiet_since
        if self.progress == 0 and now - self.opened_at > cfg.header_timeout_s:
            self.refuse(
                LimitExceeded(
                    "header_timeout", f"no producer header within {cfg.header_timeout_s:g} s"
                )
            )
        elif self.progress != seen:
            return now
        elif now - quiet_since > cfg.idle_timeout_s:
            if self._stream is not None and not self._done:
                self._close_idle_stream(self._stream)
            else:
                self.refuse(
                    LimitExceeded(
                        "idle_timeout",
                        f"nothing received or answered for {cfg.idle_timeout_s:g} s: closed",
                    )
                )
        return quiet_since

    def _close_idle_stream(self, stream: ProduceStream) -> None:
        """An idle producer is closed as a node closes streams when it stops: with a clean
        close answer, which producers take as "open another stream" on their next send
        (a RESOURCE_EXHAUSTED would be final to a rerouting producer, and an idle one did
        nothing wrong). Cut CLOSE_GRACE_S later if it does not take the answer."""
        self._port.service.count_limit("idle_timeout")
        self._refused = self._done = True
        log.debug("idle producer closed", extra={"peer": self.peer})
        stream.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)

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
            self.close()

    async def _read_header(self) -> pb.CreateProducerRequest | None:
        try:
            got = await self._header
        except StreamingError as err:
            await self.abort(err)
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


class ProducePort(plain_port.PlainPort):
    """Listens next to the gRPC server; every connection is one Produce stream."""

    def __init__(self, service, config: NodeConfig, buffer: ReceiveBuffer) -> None:
        super().__init__(config, buffer, "produce-port")
        self.service = service

    def _connect(self) -> _Connection:
        return _Connection(self)

    async def _watch(self) -> None:
        """Every connection's header and idle timeouts, checked a few times per timeout."""
        cfg = self.config
        period = min(max(min(cfg.header_timeout_s, cfg.idle_timeout_s) / 4, 0.05), 5.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for conn, (seen, since) in list(self._open.items()):
                if conn in self._open and not conn.lost:
                    quiet = conn.check_timeouts(now, seen, since)
                    if conn in self._open:
                        self._open[conn] = (conn.progress, quiet)
