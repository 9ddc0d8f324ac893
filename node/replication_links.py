"""A follower's end of its Replicate stream: the leader's replication port, else gRPC.

Either way a link is a queue of what the leader sent (LogEntries, then the exception the
stream ended with) and a `write` of ReplicaAcks; the follower's loop (replication.py)
is the same over both. Over the replication port (node/replication_port.py) entries are
cut from the socket's bytes in `data_received` and queued there: the follower's loop is
the one task woken per batch of entries, with no gRPC poller thread and reader task in
between. A leader that offers no port (0: --replication-listen off, TLS, an older node)
or whose port cannot be reached is followed over gRPC, as producers fall back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.errors import Inner, StreamingError, Unavailable
from streamwal.grpc_errors import from_rpc_error
from streamwal.node import plain_port
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig, describe_node, internal_of, make_channel

log = logging.getLogger("streamwal.node.replication")

REPLICATE = "/milvus.proto.streaming.StreamingNodeReplicationService/Replicate"
QUEUE = 1024  # entries received and not yet applied; reading waits above it
CONNECT_TIMEOUT_S = 1.0  # a port that neither answers nor refuses is treated as closed


class Link(Protocol):
    """One Replicate stream, follower side."""

    queue: asyncio.Queue  # LogEntries, then the exception the stream ended with

    async def write(self, ack: pb.ReplicaAck) -> None: ...

    def beat(self, ack: Callable[[], pb.ReplicaAck]) -> None:
        """A heartbeat, `ack()` made as it is written and nothing awaited: it must not wait
        behind the follower's loop, which may be waiting for its disk (the leader's quorum
        lease is about reaching its followers, not about their disks' speed)."""

    def took(self) -> None:
        """Entries were taken from `queue` (reading may go on)."""

    async def close(self) -> None: ...


async def open_link(address: str) -> Link:
    """A stream to the leader clients reach at `address`: over its replication port when
    it offers one and it answers, else over gRPC Replicate on its internal listener."""
    config = TransportConfig.from_env()
    try:  # asked anew at every reconnect: a restarted leader has new ports
        answer = await describe_node(address, config)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    host = address.rpartition(":")[0].strip("[]")
    if answer.replication_port and host and "/" not in host and not config.tls:
        try:
            return await _open_wire(host, answer.replication_port)
        except (OSError, TimeoutError) as exc:
            log.info(
                "replication port unreachable, following over gRPC",
                extra={"leader": address, "port": answer.replication_port, "error": repr(exc)},
            )
    return _GrpcLink(make_channel(internal_of(address, answer), config))


async def _open_wire(host: str, port: int) -> WireLink:
    loop = asyncio.get_running_loop()
    _, link = await asyncio.wait_for(
        loop.create_connection(WireLink, host, port), CONNECT_TIMEOUT_S
    )
    return link


class WireLink(wire.FramedProtocol):
    """The replication port's connection: LOG_ENTRY frames queued as they arrive, an
    ERROR frame (the leader's StreamingError) or a broken connection ends the queue."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: asyncio.Queue = asyncio.Queue()  # bounded by reading (QUEUE)
        self._ended = False
        self._broken: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        plain_port.keep_alive(transport)

    def data_received(self, data: bytes) -> None:
        if not self._ended:
            self.cutter.feed(data)
            self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._broken = exc
        self._pump()

    def _pump(self) -> None:
        while not self._ended and self.queue.qsize() < QUEUE:
            try:
                got = self.next_frame()
            except wire.FrameError as exc:
                self._end(Unavailable(f"replication port connection broke: {exc}"))
                break
            if got is None:
                if self.eof:
                    why = f": {self._broken}" if self._broken else ""
                    self._end(Inner(f"the leader closed the replication stream{why}"))
                break
            self._take(*got)
        self.hold_reading(not self._ended and self.queue.qsize() >= QUEUE)

    def _take(self, kind: int, body: memoryview) -> None:
        try:
            if kind == wire.LOG_ENTRY:
                self.queue.put_nowait(pb.LogEntry.FromString(body))
            elif kind == wire.ERROR:
                self._end(StreamingError.from_proto(pb.StreamingError.FromString(body)))
            else:
                self._end(Unavailable(f"the leader sent frame kind {kind} on a replication stream"))
        except DecodeError as exc:
            self._end(Unavailable(f"garbled frame on the replication port: {exc}"))

    def _end(self, err: StreamingError) -> None:
        self._ended = True
        self.queue.put_nowait(err)

    def took(self) -> None:
        if self._reading_paused:
            self._pump()

    async def write(self, ack: pb.ReplicaAck) -> None:
        if self.lost or self.transport.is_closing():
            raise Inner("the replication stream ended")
        self.transport.write(wire.frame(wire.REPLICA_ACK, ack.SerializeToString()))
        try:
            await self.drain()
        except ConnectionError:
            raise Inner("the replication stream ended") from None

    def beat(self, ack: Callable[[], pb.ReplicaAck]) -> None:
        if not self.lost and not self.transport.is_closing():
            self.transport.write(wire.frame(wire.REPLICA_ACK, ack().SerializeToString()))

    async def close(self) -> None:
        self.transport.close()


class _GrpcLink:
    """gRPC Replicate on the leader's internal listener; a task reads its entries."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._call = channel.stream_stream(
            REPLICATE,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.LogEntry.FromString,
        )()
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=QUEUE)
        self._reader = asyncio.ensure_future(self._pump())
        # One write at a time on a gRPC stream; a heartbeat's ack is made once it holds
        # the lock, so acks go out in the order of the offsets they carry.
        self._writing = asyncio.Lock()
        self._beating: asyncio.Task | None = None

    async def _pump(self) -> None:
        """LogEntries into `queue`, then the reason the stream ended (an exception)."""
        try:
            async for entry in self._call:
                await self.queue.put(entry)
            await self.queue.put(Inner("the leader closed the replication stream"))
        except grpc.RpcError as exc:
            await self.queue.put(from_rpc_error(exc))

    async def write(self, ack: pb.ReplicaAck) -> None:
        try:
            async with self._writing:
                await self._call.write(ack)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        except asyncio.InvalidStateError:  # the stream ended while we acknowledged
            raise Inner("the replication stream ended") from None

    def beat(self, ack: Callable[[], pb.ReplicaAck]) -> None:
        if self._beating is None or self._beating.done():
            self._beating = asyncio.ensure_future(self._beat(ack))

    async def _beat(self, ack: Callable[[], pb.ReplicaAck]) -> None:
        # A broken stream is the follower loop's to report: its reads end with the error.
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            async with self._writing:
                await self._call.write(ack())

    def took(self) -> None:
        pass  # the reader task waits for room itself

    async def close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        self._reader.cancel()
        self._call.cancel()
        await self._channel.close()
