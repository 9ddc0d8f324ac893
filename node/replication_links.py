"""A follower's end of its Replicate stream: the leader's replication port, else gRPC.

Either way a link hands what the leader sent (lists of LogEntries, then the exception the
stream ended with) to the follower's `sink` as it arrives, and `send`s ReplicaAcks
without waiting; the follower's stream (replication.FollowerStream) is the same over
both. Over the replication port (node/replication_port.py) entries are cut from the
socket's bytes in `data_received` and handed over there, all those of one read at
once: the follower applies them in that call, no task is woken. A leader that offers no
port (0: --replication-listen off, TLS, an older node) or whose port cannot be reached
is followed over gRPC, as producers fall back: a task reads its entries into the sink
and one writes the acks.

The sink answers False when it holds QUEUE items or more not yet applied: the link then
reads nothing more (over the port, TCP holds the leader back) until `took`. Acks are not
held back: one goes out per applied batch, and the leader's window (WINDOW_BYTES of
records not yet acknowledged) bounds how many batches there are.
"""

from __future__ import annotations

import asyncio
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


# Takes what a link received: LogEntries, and last the exception the stream ended with;
# False when it holds too much not yet applied (the link reads on after `took`).
Sink = Callable[[list], bool]


class Link(Protocol):
    """One Replicate stream, follower side."""

    def start(self, sink: Sink) -> None:
        """Hand what arrives to `sink` from now on."""

    def send(self, ack: pb.ReplicaAck) -> None:
        """Write an ack without waiting; raises Inner once the stream is over."""

    def took(self) -> None:
        """The sink applied what it held (reading may go on)."""

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
    """The replication port's connection: LOG_ENTRY frames handed to the sink as they
    arrive, an ERROR frame (the leader's StreamingError) or a broken connection ends
    the stream."""

    def __init__(self) -> None:
        super().__init__()
        self._sink: Sink | None = None
        self._held = False  # the sink holds QUEUE items: read nothing until `took`
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

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self._pump()

    def _pump(self) -> None:
        """The whole frames received so far (QUEUE at a time) into the sink."""
        while self._sink is not None and not self._ended and not self._held:
            got: list = []
            while len(got) < QUEUE and not self._ended:
                try:
                    frame = self.next_frame()
                except wire.FrameError as exc:
                    got.append(self._end(Unavailable(f"replication port connection broke: {exc}")))
                    break
                if frame is None:
                    if self.eof:
                        why = f": {self._broken}" if self._broken else ""
                        closed = Inner(f"the leader closed the replication stream{why}")
                        got.append(self._end(closed))
                    break
                got.append(self._take(*frame))
            if not got:
                break
            self._held = not self._sink(got)
        self.hold_reading(self._held and not self._ended)

    def _take(self, kind: int, body: memoryview) -> pb.LogEntry | StreamingError:
        try:
            if kind == wire.LOG_ENTRY:
                return pb.LogEntry.FromString(body)
            if kind == wire.ERROR:
                return self._end(StreamingError.from_proto(pb.StreamingError.FromString(body)))
            what = f"the leader sent frame kind {kind} on a replication stream"
            return self._end(Unavailable(what))
        except DecodeError as exc:
            return self._end(Unavailable(f"garbled frame on the replication port: {exc}"))

    def _end(self, err: StreamingError) -> StreamingError:
        self._ended = True
        return err

    def took(self) -> None:
        if self._held:
            self._held = False
            self._pump()

    def send(self, ack: pb.ReplicaAck) -> None:
        if self.lost or self.transport.is_closing():
            raise Inner("the replication stream ended")
        self.transport.write(wire.frame(wire.REPLICA_ACK, ack.SerializeToString()))

    async def close(self) -> None:
        self.transport.close()


class _GrpcLink:
    """gRPC Replicate on the leader's internal listener: a task reads its entries into
    the sink, one writes the acks (a gRPC stream takes one write at a time)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._call = channel.stream_stream(
            REPLICATE,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.LogEntry.FromString,
        )()
        self._acks: asyncio.Queue[pb.ReplicaAck] = asyncio.Queue()
        self._room = asyncio.Event()
        self._tasks: list[asyncio.Future] = []
        self._sink: Sink | None = None

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._write())]

    async def _read(self) -> None:
        """LogEntries into the sink, then the reason the stream ended (an exception)."""
        assert self._sink is not None
        try:
            async for entry in self._call:
                if not self._sink([entry]):
                    self._room.clear()
                    await self._room.wait()
            self._sink([Inner("the leader closed the replication stream")])
        except grpc.RpcError as exc:
            self._sink([from_rpc_error(exc)])

    async def _write(self) -> None:
        """The acks, in order; a failed write ends the stream."""
        assert self._sink is not None
        try:
            while True:
                await self._call.write(await self._acks.get())
        except grpc.RpcError as exc:
            self._sink([from_rpc_error(exc)])
        except asyncio.InvalidStateError:  # the stream ended while we acknowledged
            self._sink([Inner("the replication stream ended")])

    def send(self, ack: pb.ReplicaAck) -> None:
        if self._call.done():
            raise Inner("the replication stream ended")
        self._acks.put_nowait(ack)

    def took(self) -> None:
        self._room.set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._call.cancel()
        await self._channel.close()
