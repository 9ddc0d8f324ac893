"""streamwal itself as a System: a real `streamwal node` process and the Python client.

The node is started like a user would (`streamwal node --listen ... --data-dir ...`), a
pchannel is assigned per stream with term 1, and every producer is its own NodeClient
(its own gRPC channel). Batches go through `send_many` (one atomic append per batch);
single sends through `send`; reads through a consumer with DeliverPolicy.all(). With
replicas (issue 8's workload 5) the same runs go to the leader of a replicated pchannel.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamwal import transport
from streamwal.bench.procs import HOST, Server, stop_all
from streamwal.testing.local_node import free_port

TERM = 1
DURABILITY = {
    "sync": "sync (default): one fsync per group commit of RocksDB before any ack in it",
    "async": "async: acked once the OS has the write (survives kill -9, not power loss)",
}
QUORUM = (
    "quorum: fsynced on a majority of {} replicas (node processes on this machine) before any ack"
)


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
    """The consumer's own frame-at-a-time `next_batch`, without the node's time ticks; the
    payloads come as the batch's column (no message object each), as Redis's come as a
    list from XREAD."""

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
        return batch.payloads

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
        try:
            await self._consumer.close()
        finally:
            await self._client.__aexit__(None, None, None)


class Streamwal:
    """Node processes with their data in the run's temp dir: one, or `replicas` holding
    every stream as a replicated pchannel (node 1 leads, producers ack at QUORUM).

    `idempotent=False` opens producers without idempotence: the guarantee Redis's XADD
    and a NATS publish without a message id give, so the two compare like for like.
    """

    def __init__(
        self, durability: str = "sync", replicas: int = 1, idempotent: bool = True
    ) -> None:
        self.name = (
            "streamwal"
            + ("_async" if durability == "async" else "")
            + (f"_r{replicas}" if replicas > 1 else "")
        )
        self.durability = DURABILITY[durability] if replicas == 1 else QUORUM.format(replicas)
        if not idempotent:
            self.durability += "; producers without idempotence (no dedup, as the peers)"
        self._idempotent = idempotent
        self._mode = durability
        self._replicas = replicas
        self._servers: list[Server] = []
        self._members: list[tuple[int, str]] = []
        self._admin = None

    @property
    def _address(self) -> str:
        return self._members[0][1]  # the leader's

    async def _client(self, address: str = ""):
        from streamwal.client.node_client import NodeClient

        client = NodeClient(address or self._address)
        await client.__aenter__()
        return client

    @staticmethod
    async def _serving(address: str) -> bool:
        channel = transport.make_channel(address)
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except Exception:
            return False
        finally:
            await channel.close()

    @staticmethod
    def data_dir(workdir: Path, node_id: int = 1) -> Path:
        """Where node `node_id` of a system started in `workdir` keeps its store."""
        return workdir / f"data{node_id}"

    async def start(self, workdir: Path) -> None:
        for node_id in range(1, self._replicas + 1):
            address = f"{HOST}:{free_port()}"
            name = self.name if self._replicas == 1 else f"{self.name}-node{node_id}"
            server = Server(
                name,
                [
                    _streamwal_binary(),
                    "node",
                    "--listen",
                    address,
                    "--data-dir",
                    str(self.data_dir(workdir, node_id)),
                    "--node-id",
                    str(node_id),
                    "--durability",
                    self._mode,
                    "--log-level",
                    "warning",
                ],
                workdir,
            )
            server.start()
            self._servers.append(server)
            self._members.append((node_id, address))
        for server, (_, address) in zip(self._servers, self._members, strict=True):
            await server.wait_ready(lambda a=address: self._serving(a), timeout=30.0)
        self._admin = [await self._client(address) for _, address in self._members]

    @property
    def server_pid(self) -> int:
        """The process that answers producers: node 1, the leader with replicas."""
        return self._servers[0].pid

    @property
    def pids(self) -> list[int]:
        """Every node process, the leader first."""
        return [server.pid for server in self._servers]

    async def stop(self) -> None:
        for admin in self._admin or ():
            with contextlib.suppress(Exception):
                await admin.__aexit__(None, None, None)
        self._admin = None
        stop_all(self._servers)
        self._servers, self._members = [], []

    async def create_stream(self, stream: str, leader: int = 0) -> None:
        """`stream` on every node; with replicas, led by the node at index `leader`
        (compare's streams: node 1)."""
        from streamwal.client.node_client import replica_set

        if self._replicas == 1:
            await self._admin[0].assign(stream, term=TERM)
            return
        for i, admin in enumerate(self._admin):
            led = i == leader
            rs = replica_set(led, self._members, None if led else self._members[leader])
            await admin.assign(stream, term=TERM, replica_set=rs)

    async def drop_stream(self, stream: str) -> None:
        for admin in self._admin:
            await admin.remove(stream, term=TERM)

    async def producer(self, stream: str) -> StreamwalProducer:
        client = await self._client()
        producer = await client.producer(stream, term=TERM, idempotent=self._idempotent)
        return StreamwalProducer(client, producer)

    async def reader(self, stream: str, batch: int) -> StreamwalReader:
        from streamwal.client.policy import DeliverPolicy

        client = await self._client()
        consumer = await client.consumer(
            stream, term=TERM, policy=DeliverPolicy.all(), time_ticks=False
        )
        return StreamwalReader(client, consumer)
