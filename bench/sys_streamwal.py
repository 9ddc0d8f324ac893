"""streamwal itself as a System: a real `streamwal node` process and the Python client.

The node is started like a user would (`streamwal node --listen ... --data-dir ...`), a
pchannel is assigned per stream with term 1, and every producer is its own NodeClient
(its own gRPC channel). Batches go through `send_many` (one atomic append per batch);
single sends through `send`; reads through a consumer with DeliverPolicy.all().
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamwal import transport
from streamwal.bench.procs import HOST, Server, free_port

TERM = 1
DURABILITY = {
    "sync": "sync (default): one fsync per group commit of RocksDB before any ack in it",
    "async": "async: acked once the OS has the write (survives kill -9, not power loss)",
}


def _streamwal_binary() -> str:
    beside = Path(sys.executable).with_name("streamwal")
    return str(beside) if beside.exists() else (shutil.which("streamwal") or "streamwal")


class StreamwalProducer:
    def __init__(self, client, producer) -> None:
        self._client = client
        self._producer = producer

    async def send_batch(self, payloads: list[bytes]) -> None:
        await self._producer.send_many(payloads)

    async def send_one(self, payload: bytes) -> None:
        await self._producer.send(payload)

    async def close(self) -> None:
        try:
            await self._producer.close()
        finally:
            await self._client.__aexit__(None, None, None)


class StreamwalReader:
    """The consumer's own frame-at-a-time `next_batch`, without the node's time ticks."""

    def __init__(self, client, consumer) -> None:
        self._client = client
        self._consumer = consumer
        self._pending: asyncio.Future | None = None

    async def next_batch(self, timeout: float) -> list[bytes]:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._consumer.next_batch())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return []
        batch, self._pending = self._pending.result(), None
        if batch is None:
            raise RuntimeError("the node closed the consumer stream")
        return [m.payload for m in batch]

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
        try:
            await self._consumer.close()
        finally:
            await self._client.__aexit__(None, None, None)


class Streamwal:
    """One node process with its data in the run's temp dir."""

    name = "streamwal"

    def __init__(self, durability: str = "sync") -> None:
        self.durability = DURABILITY[durability]
        self._mode = durability
        self._server: Server | None = None
        self._address = ""
        self._admin = None

    async def _client(self):
        from streamwal.client.node_client import NodeClient

        client = NodeClient(self._address)
        await client.__aenter__()
        return client

    async def _serving(self) -> bool:
        channel = transport.make_channel(self._address)
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except Exception:
            return False
        finally:
            await channel.close()

    async def start(self, workdir: Path) -> None:
        self._address = f"{HOST}:{free_port()}"
        self._server = Server(
            self.name,
            [
                _streamwal_binary(),
                "node",
                "--listen",
                self._address,
                "--data-dir",
                str(workdir / "data"),
                "--node-id",
                "1",
                "--durability",
                self._mode,
                "--log-level",
                "warning",
            ],
            workdir,
        )
        self._server.start()
        await self._server.wait_ready(self._serving, timeout=30.0)
        self._admin = await self._client()

    async def stop(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.__aexit__(None, None, None)
            self._admin = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def create_stream(self, stream: str) -> None:
        await self._admin.assign(stream, term=TERM)

    async def drop_stream(self, stream: str) -> None:
        await self._admin.remove(stream, term=TERM)

    async def producer(self, stream: str) -> StreamwalProducer:
        client = await self._client()
        return StreamwalProducer(client, await client.producer(stream, term=TERM))

    async def reader(self, stream: str, batch: int) -> StreamwalReader:
        from streamwal.client.policy import DeliverPolicy

        client = await self._client()
        consumer = await client.consumer(
            stream, term=TERM, policy=DeliverPolicy.all(), time_ticks=False
        )
        return StreamwalReader(client, consumer)
