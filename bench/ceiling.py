"""The ceiling, measured in the same run: what the node's two halves cost on their own.

- `NoopGrpc`: the node's Produce / Consume protocol against a server that stores frames
  in a list (bench/noop_server.py), driven by a minimal client over the raw stubs. It
  bounds what any Python node reached over gRPC can do.
- `rocks_*`: raw `rocksdict` writes and reads of the same records, sync per batch as
  streamwal's default durability: one value per batch (streamwal's record layout: a
  header plus the serialized MessageBatch) and, for reference, one key per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import sys
import time
from pathlib import Path

import grpc
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from streamwal import transport
from streamwal.bench import stats
from streamwal.bench.noop_server import CONSUMER_HEADER, PRODUCER_HEADER
from streamwal.bench.procs import HOST, OneServer, Server, port_open
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg
from streamwal.testing.local_node import free_port

_U64 = struct.Struct(">Q")
_RECORD_PAD = bytes(24)  # node/records.py's header is 28 bytes, its count last
_COUNT = struct.Struct(">I")


def _batch_bytes(payloads: list[bytes]) -> bytes:
    return pb.MessageBatch(messages=[pb.Message(payload=p) for p in payloads]).SerializeToString()


class GrpcProducer:
    """Pipelined batch frames over one Produce stream, replies matched by request id."""

    def __init__(self, channel, stream: str) -> None:
        self._channel = channel
        header = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=stream, term=1))
        self._call = pbg.StreamingNodeHandlerServiceStub(channel).Produce(
            metadata=[(PRODUCER_HEADER, header.SerializeToString())]
        )
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._write_lock = asyncio.Lock()
        self._replies: asyncio.Task | None = None

    async def open(self) -> GrpcProducer:
        first = await self._call.read()
        if first.WhichOneof("response") != "create":
            raise RuntimeError(f"producer not created: {first}")
        self._replies = asyncio.create_task(self._dispatch())
        return self

    async def _dispatch(self) -> None:
        while True:
            resp = await self._call.read()
            if resp is grpc.aio.EOF:
                break
            kind = resp.WhichOneof("response")
            reply = getattr(resp, kind)
            fut = self._waiting.pop(getattr(reply, "request_id", 0), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        for fut in self._waiting.values():
            fut.set_exception(RuntimeError("produce stream ended"))

    async def _request(self, make) -> object:
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        async with self._write_lock:
            await self._call.write(make(rid))
        return await fut

    async def send_batch(self, payloads: list[bytes]) -> None:
        body = _batch_bytes(payloads)
        await self._request(
            lambda rid: pb.ProduceRequest(
                produce_batch=pb.ProduceBatchRequest(request_id=rid, messages=body)
            )
        )

    async def send_one(self, payload: bytes) -> None:
        await self._request(
            lambda rid: pb.ProduceRequest(
                produce=pb.ProduceMessageRequest(
                    request_id=rid, message=pb.Message(payload=payload)
                )
            )
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with self._write_lock:
                await self._call.write(pb.ProduceRequest(close=pb.CloseProducerRequest()))
                await self._call.done_writing()
        self._call.cancel()
        if self._replies is not None:
            self._replies.cancel()
            await asyncio.gather(self._replies, return_exceptions=True)
        await self._channel.close()


class GrpcReader:
    """One Consume stream with batch frames; each frame's MessageBatch parsed once."""

    def __init__(self, channel, stream: str) -> None:
        self._channel = channel
        header = pb.CreateConsumerRequest(
            pchannel=pb.PChannelInfo(name=stream, term=1),
            deliver_policy=pb.DeliverPolicy(all={}),
            options=pb.ConsumerOptions(batched=True),
        )
        self._call = pbg.StreamingNodeHandlerServiceStub(channel).Consume(
            metadata=[(CONSUMER_HEADER, header.SerializeToString())]
        )
        self._pending: asyncio.Task | None = None

    async def next_batch(self, timeout: float) -> list[bytes]:
        while True:
            if self._pending is None:
                self._pending = asyncio.ensure_future(self._call.read())
            done, _ = await asyncio.wait({self._pending}, timeout=timeout)
            if not done:
                return []
            resp, self._pending = self._pending.result(), None
            if resp.WhichOneof("response") == "consume_batch":
                return [
                    m.payload
                    for m in pb.MessageBatch.FromString(resp.consume_batch.messages).messages
                ]

    async def close(self) -> None:
        self._call.cancel()
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
        await self._channel.close()


class NoopGrpc(OneServer):
    """The no-op server in its own process, as a System for the shared workloads."""

    name = "grpc_noop"
    durability = "none: frames kept in the server's memory (the transport ceiling)"

    def __init__(self) -> None:
        self._server: Server | None = None
        self._address = ""

    async def start(self, workdir: Path) -> None:
        port = free_port()
        self._address = f"{HOST}:{port}"
        self._server = Server(
            self.name,
            [sys.executable, "-m", "streamwal.bench.noop_server", "--port", str(port)],
            workdir,
        )
        self._server.start()
        await self._server.wait_ready(lambda: port_open(port))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def create_stream(self, stream: str) -> None:
        return None

    async def drop_stream(self, stream: str) -> None:
        producer = GrpcProducer(transport.make_channel(self._address), f"drop:{stream}")
        with contextlib.suppress(Exception):
            await producer._call.read()
        await producer.close()

    async def producer(self, stream: str) -> GrpcProducer:
        return await GrpcProducer(transport.make_channel(self._address), stream).open()

    async def reader(self, stream: str, batch: int) -> GrpcReader:
        return GrpcReader(transport.make_channel(self._address), stream)


def rocks_write(
    path: Path,
    count: int,
    size: int,
    per_batch: int,
    per_message_keys: bool,
    seconds: float,
    records_per_sync: int = 1,
) -> dict[str, float]:
    """Sync writes of `count` messages, `records_per_sync` batches of `per_batch` per fsync.

    `records_per_sync` mirrors the node's group commit: the batches its producers have in
    flight at once (producers x window) share one WriteBatch and one fsync.
    """
    pool = [os.urandom(size) for _ in range(256)]
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(path), opts)
    sync = WriteOptions()
    sync.sync = True
    written, sync_latencies = 0, []
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    try:
        while written < count and time.perf_counter() < deadline:
            wb = WriteBatch(raw_mode=True)
            group = 0
            for _ in range(records_per_sync):
                n = min(per_batch, count - group - written)
                if n <= 0:
                    break
                payloads = [pool[(written + group + i) % 256] for i in range(n)]
                if per_message_keys:
                    for i, p in enumerate(payloads):
                        wb.put(b"l\0" + _U64.pack(written + group + i), p)
                else:
                    wb.put(
                        b"l\0" + _U64.pack(written + group),
                        _RECORD_PAD + _COUNT.pack(n) + _batch_bytes(payloads),
                    )
                group += n
            b0 = time.perf_counter()
            db.write(wb, sync)
            sync_latencies.append(time.perf_counter() - b0)
            written += group
        elapsed = time.perf_counter() - t0
        summary = stats.latency_summary(sync_latencies)
    finally:
        db.close()
    return {
        "count": written,
        "seconds": elapsed,
        "msgs_per_s": stats.rate(written, elapsed),
        "records_per_sync": records_per_sync,
        "sync_write_p50_ms": summary["p50_ms"],
        "sync_write_p99_ms": summary["p99_ms"],
    }


def rocks_read(path: Path, per_message_keys: bool, seconds: float) -> dict[str, float]:
    """Reads back everything `rocks_write` stored, in key order, counting messages."""
    opts = Options(raw_mode=True)
    db = Rdict(str(path), opts)
    got = 0
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    try:
        it = db.iter()
        it.seek_to_first()
        while it.valid() and time.perf_counter() < deadline:
            value = it.value()
            # The node serves a record's bytes as they are; only the count is read.
            got += 1 if per_message_keys else _COUNT.unpack_from(value, len(_RECORD_PAD))[0]
            it.next()
        elapsed = time.perf_counter() - t0
        del it
    finally:
        db.close()
    return {"count": got, "seconds": elapsed, "msgs_per_s": stats.rate(got, elapsed)}
