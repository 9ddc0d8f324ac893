"""The replication port: a follower's Replicate stream over plain TCP frames (wire.proto).

A thin adapter, as the produce port is for producers: the stream's logic is the gRPC
stream's (replication.LeaderStream), this only turns frames into its acks and its
entries into frames. It exists for the same reason: grpc.aio passes every message of a
stream through a poller thread and back into the event loop on both ends, and a
one-at-a-time RF=3 send crosses each follower's stream twice (the entry down, the ack
up) -- most of a quorum append's CPU (docs/decisions-replicated-path.md). A connection
is a protocol that parses acks in `data_received` and hands each to the stream there: no
reader task is woken per ack.

It listens on the internal listener's host, never where only the client port is
reachable: a follower's acks count toward a quorum, so whoever can open a stream here
can acknowledge records. With TLS configured it stays closed (it has no transport
security; followers then use gRPC Replicate, as producers use gRPC Produce).

Its limits (node/limits.py), as the produce port's: connections in total and per peer
address, the largest frame (refused from its header), the bytes of frames still
arriving on all connections, and a new connection's header timeout. An open stream is
never idle by the idle timeout (as gRPC counts only connections without calls): a
follower of a quiet pchannel keeps its stream, and the leader's window bounds what it
sends. What the leader writes waits while the socket's buffer is full. Both ends give up
on a peer that stops answering as gRPC's keepalive would (`plain_port.keep_alive`).
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.errors import InvalidArgument, OnShutdown, StreamingError
from streamwal.node import plain_port, validation
from streamwal.node.config import NodeConfig
from streamwal.node.limits import LimitExceeded, ReceiveBuffer
from streamwal.node.replication import LeaderStream, Replication
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.replication_port")

CLOSE_GRACE_S = plain_port.CLOSE_GRACE_S
JOIN_BYTES = 64 * 1024  # an entry below this is copied behind its header, one write


class _Connection(wire.FramedProtocol):
    """One follower's stream: its first frame is a ReplicaAck with its term history (the
    stream opens at once, in `data_received`), the rest its acks."""

    def __init__(self, port: ReplicationPort) -> None:
        super().__init__(port.config.max_frame_bytes)
        self._port = port
        self.stream: LeaderStream | None = None
        self._done = False  # refused, or the follower's side ended: take nothing more
        self._refused = False  # the ERROR frame is written: the peer's close ends it
        self.peer = ""  # the peer's address, once counted against the connection limits
        self.opened_at = asyncio.get_running_loop().time()
        self.charged = 0  # bytes held in the cutter, charged to the port's receive buffer

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        plain_port.keep_alive(transport)
        peer = transport.get_extra_info("peername")
        try:
            self._port.admit(self, str(peer[0]) if isinstance(peer, tuple) else str(peer))
        except LimitExceeded as err:
            self.refuse(err)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return  # refused or over: what the peer still sends is dropped
        self.cutter.feed(data)
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._pump()
        if self.stream is not None:
            self.stream.end(None)  # ends quietly; a leader has nothing to tell a gone peer
        self._port.closed(self)

    # -- acks in --------------------------------------------------------------------

    def _pump(self) -> None:
        while not self._done:
            try:
                got = plain_port.next_frame(self, "replication port")
            except StreamingError as err:
                self.refuse(err)
                break
            if got is None:
                if self.eof:
                    self._done = True
                    if self.stream is not None:
                        self.stream.end(None)
                break
            self._take(*got)
        held = self.cutter.buffered() if not self._done else 0
        try:
            self.charged = plain_port.charge(self._port.buffer, self.charged, held)
        except LimitExceeded as err:
            self.refuse(err)

    def _take(self, kind: int, body: memoryview) -> None:
        if kind != wire.REPLICA_ACK:
            self.refuse(InvalidArgument(f"frame kind {kind} on the replication port"))
            return
        try:
            ack = pb.ReplicaAck.FromString(body)
        except DecodeError as exc:
            self.refuse(InvalidArgument(f"garbled ReplicaAck: {exc}"))
            return
        if self.stream is not None:
            if not self.stream.take(ack):
                self._done = True  # the stream ends with its error (`_serve`)
            return
        try:
            validation.replica_ack(ack)
            if not self._port.serving():
                raise OnShutdown("node is shutting down")
            self.stream = self._port.replication.open_stream(
                ack, self.write, "port", self.write_now
            )
        except StreamingError as err:
            self.refuse(err)
            return
        self._port.opened(asyncio.ensure_future(self._serve(self.stream)))

    # -- entries out ----------------------------------------------------------------

    async def write(self, entry: pb.LogEntry | bytes) -> None:
        if self.lost or self.transport.is_closing():
            raise ConnectionResetError("the replication connection is closing")
        self._put(entry if isinstance(entry, bytes) else entry.SerializeToString())
        await self.drain()

    def write_now(self, body: bytes) -> bool:
        """Write a serialized LogEntry if it goes out at once (nothing buffered before
        it); False: the stream's task writes it and waits for the socket."""
        if self.lost or not self.can_write_now():
            return False
        self._put(body)
        return True

    def _put(self, body: bytes) -> None:
        if len(body) < JOIN_BYTES:
            self.transport.write(wire.frame(wire.LOG_ENTRY, body))
        else:  # a batch of records: handed over as it is, not copied behind the header
            self.transport.writelines([wire.head(wire.LOG_ENTRY, len(body)), body])

    async def _serve(self, stream: LeaderStream) -> None:
        try:
            await self._port.replication.serve(stream)
        except StreamingError as err:
            self.refuse(err, count=False)
        except ConnectionError:
            pass  # the follower went away; it reconnects
        finally:
            self._done = True
            if not self._refused and not self.transport.is_closing():
                self.transport.close()

    def refuse(self, err: StreamingError, count: bool = True) -> None:
        """Send `err` as the last frame and close: the follower's stream ends with it, as
        with a gRPC status. What the peer still sends is dropped; the connection is gone
        CLOSE_GRACE_S later at most."""
        if count:
            self._port.count_limit(err)
        self._done = True
        if self.stream is not None:
            self.stream.end(err)
        if not self._refused and not self.transport.is_closing():
            self._refused = True
            self.transport.write(wire.frame(wire.ERROR, err.to_proto().SerializeToString()))
            if self.transport.can_write_eof():
                self.transport.write_eof()  # closing with unread input could lose the frame
            else:
                self.transport.close()
            asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)

    def check_header(self, now: float) -> None:
        """Refuse the connection if it sent no first ack within the header timeout."""
        timeout = self._port.config.header_timeout_s
        if self.stream is None and not self._done and now - self.opened_at > timeout:
            self.refuse(
                LimitExceeded("header_timeout", f"no first ReplicaAck within {timeout:g} s")
            )


class ReplicationPort(plain_port.PlainPort):
    """Listens next to the internal listener; every connection is one follower's stream."""

    def __init__(
        self, replication: Replication, service, config: NodeConfig, buffer: ReceiveBuffer
    ) -> None:
        super().__init__(config, buffer, "replication-port")
        self.replication = replication
        self._service = service

    def _connect(self) -> _Connection:
        return _Connection(self)

    def serving(self) -> bool:
        return bool(self._service.serving)

    def count_limit(self, err: StreamingError) -> None:
        self._service.count_limit(err)

    async def _watch(self) -> None:
        """New connections' header timeouts, checked a few times per timeout."""
        period = min(max(self.config.header_timeout_s / 4, 0.05), 5.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for conn in list(self._open):
                conn.check_header(now)  # type: ignore[attr-defined]
