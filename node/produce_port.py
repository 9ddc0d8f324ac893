"""The produce port: Produce streams over plain TCP frames (proto/wire.proto).

A thin adapter like the gRPC one: it turns frames into the requests `ProduceStream`
reads and its answers into frames, and nothing else. It exists for latency: grpc.aio
passes every frame through a poller thread and back into the event loop on both sides,
which costs a one-at-a-time producer about half a millisecond per message on a small
machine (docs/decisions.md). With TLS configured the port stays closed: it has no
transport security of its own, and producers then use gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from google.protobuf.message import DecodeError

from streamwal import wire
from streamwal.errors import InvalidArgument, OnShutdown, StreamingError
from streamwal.node.produce_stream import Malformed
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.produce_port")


class _FrameSink:
    """A Produce stream's answers as frames on one connection."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, response: pb.ProduceResponse) -> None:
        self._writer.write(wire.frame(wire.PRODUCE_RESPONSE, response.SerializeToString()))
        await self._writer.drain()

    def write_now(self, response: pb.ProduceResponse) -> bool:
        transport = self._writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False  # a slow reader's backlog: `write` waits for it to drain
        self._writer.write(wire.frame(wire.PRODUCE_RESPONSE, response.SerializeToString()))
        return True

    async def abort(self, err: StreamingError) -> None:
        self._writer.write(wire.frame(wire.ERROR, err.to_proto().SerializeToString()))
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()
        self._writer.close()


async def _requests(reader: asyncio.StreamReader, limit: int) -> AsyncIterator:
    """ProduceRequests as the gRPC handler yields them: parsed, or a `Malformed`."""
    while True:
        try:
            got = await wire.read_frame(reader, limit)
        except wire.FrameError as exc:
            yield Malformed("produce port", exc)
            return
        except ConnectionError:
            return
        if got is None:
            return
        kind, body = got
        if kind != wire.PRODUCE_REQUEST:
            yield Malformed("produce port", ValueError(f"frame kind {kind} after the header"))
            return
        try:
            yield pb.ProduceRequest.FromString(body)
        except DecodeError as exc:
            yield Malformed("ProduceRequest", exc)
            return


class ProducePort:
    """Listens next to the gRPC server; every connection is one Produce stream."""

    def __init__(self, service, frame_limit: int) -> None:
        self._service = service
        self._limit = frame_limit
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._stopping = False
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=2 * 1024 * 1024, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop accepting; give open streams `grace` seconds to finish, then cut them."""
        if self._server is None:
            return
        self._stopping = True
        self._server.close()
        if self._connections:
            _, late = await asyncio.wait(self._connections, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        sink = _FrameSink(writer)
        try:
            header = await self._header(reader, sink)
            if header is not None:
                await self._service.serve_producer(header, _requests(reader, self._limit), sink)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the producer went away; what it was not answered it never had acked
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # cut off by stop() after the grace period, as gRPC cancels its late RPCs;
            # returning (not raising) keeps asyncio's stream callback from logging it
        finally:
            self._connections.discard(task)
            writer.close()

    async def _header(
        self, reader: asyncio.StreamReader, sink: _FrameSink
    ) -> pb.CreateProducerRequest | None:
        try:
            got = await wire.read_frame(reader, self._limit)
        except wire.FrameError as exc:
            await sink.abort(InvalidArgument(f"malformed produce port frame: {exc}"))
            return None
        if got is None:
            return None
        kind, body = got
        if not self._service.serving:
            await sink.abort(OnShutdown("node is shutting down"))
            return None
        if kind != wire.CREATE_PRODUCER:
            await sink.abort(
                InvalidArgument(f"the first frame must be CREATE_PRODUCER, not {kind}")
            )
            return None
        try:
            return pb.CreateProducerRequest.FromString(body)
        except DecodeError as exc:
            await sink.abort(InvalidArgument(f"garbled CreateProducerRequest: {exc}"))
            return None
