"""NATS JetStream as a peer: `nats-server -js` with file storage, client `nats-py`.

Fastest honest use: `publish_async` for a whole batch of outstanding publishes, then
wait for all their acks; reads through a pull consumer fetching batches, AckNone (a
log reader that keeps its own position, as the other systems' readers do). The
replicated peer (`nats_r3`) is a cluster of three servers with a replicas-3 stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from streamwal.bench.procs import HOST, OneServer, Server, port_open, stop_all
from streamwal.testing.local_node import free_port

DURABILITY = (
    "JetStream file storage, 1 replica: acked once written to the OS; "
    "the server fsyncs on a timer (not per ack), so a machine crash may lose "
    "recently acked messages"
)
REPLICATED = (
    "JetStream file storage, 3 replicas on a 3-server cluster: acked once a majority "
    "of the stream's replicas wrote it to the OS (each fsyncs on a timer, not per ack)"
)
READY_S = 30.0  # a new cluster elects its JetStream meta leader, then the stream's
# One readiness probe's bound. A JetStream API request sent before the meta leader is
# elected is answered by nobody: with the client's own 5 s timeout the first probe waited
# all of it (the cluster's start took ~5.8 s, its election ~0.3 s of that).
PROBE_S = 0.5


def _subject(stream: str) -> str:
    return f"bench.{stream}"


class NatsProducer:
    def __init__(self, nc, stream: str) -> None:
        self._nc = nc
        self._js = nc.jetstream(publish_async_max_pending=100_000)
        self._subject = _subject(stream)

    async def send_batch(self, payloads: list[bytes]) -> None:
        futures = [await self._js.publish_async(self._subject, p) for p in payloads]
        await asyncio.gather(*futures)

    async def send_one(self, payload: bytes) -> None:
        await self._js.publish(self._subject, payload)

    async def close(self) -> None:
        await self._nc.close()


class NatsReader:
    def __init__(self, nc, sub, batch: int) -> None:
        self._nc = nc
        self._sub = sub
        self._batch = batch

    async def next_batch(self, timeout: float) -> list[bytes]:
        try:
            msgs = await self._sub.fetch(self._batch, timeout=max(0.01, timeout))
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        return [m.data for m in msgs]

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        await self._nc.close()


class NatsJetStream(OneServer):
    """One nats-server per instance with JetStream's store in the work dir."""

    name = "nats"
    durability = DURABILITY
    replicas = 1

    def __init__(self) -> None:
        self._server: Server | None = None
        self._url = ""
        self._admin = None

    async def _connect(self):
        return await nats.connect(
            self._url, max_reconnect_attempts=0, pending_size=64 * 1024 * 1024
        )

    async def start(self, workdir: Path) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        port = free_port()
        self._url = f"nats://{HOST}:{port}"
        store = workdir / "jetstream"
        store.mkdir(exist_ok=True)
        self._server = Server(
            self.name, [binary, "-js", "-a", HOST, "-p", str(port), "-sd", str(store)], workdir
        )
        self._server.start()
        await self._server.wait_ready(lambda: port_open(port))
        self._admin = await self._connect()

    async def stop(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
            self._admin = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def create_stream(self, stream: str, timeout: float = 5.0) -> None:
        js = self._admin.jetstream(timeout=timeout)
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[_subject(stream)],
                storage=StorageType.FILE,
                num_replicas=self.replicas,
            )
        )

    async def drop_stream(self, stream: str) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self._admin.jetstream().delete_stream(stream)

    async def producer(self, stream: str) -> NatsProducer:
        return NatsProducer(await self._connect(), stream)

    async def reader(self, stream: str, batch: int) -> NatsReader:
        nc = await self._connect()
        sub = await nc.jetstream().pull_subscribe(
            _subject(stream),
            durable=None,
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        return NatsReader(nc, sub, batch)


class NatsCluster(NatsJetStream):
    """`nats_r3`: three nats-servers routed into one JetStream cluster, each with its own
    store; clients connect to the first, the stream has 3 replicas (a majority acks)."""

    name = "nats_r3"
    durability = REPLICATED
    replicas = 3

    def __init__(self) -> None:
        super().__init__()
        self._others: list[Server] = []
        self._prepared: set[str] = set()  # created ahead, not yet asked for

    async def start(self, workdir: Path) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        ports = [free_port() for _ in range(3)]
        routes = [free_port() for _ in range(3)]
        servers = []
        for i, (port, route) in enumerate(zip(ports, routes, strict=True)):
            store = workdir / f"jetstream{i}"
            store.mkdir(exist_ok=True)
            peers = ",".join(f"nats://{HOST}:{r}" for r in routes if r != route)
            argv = [binary, "-js", "-n", f"s{i}", "-a", HOST, "-p", str(port), "-sd", str(store)]
            argv += ["--cluster_name", "bench", "--cluster", f"nats://{HOST}:{route}"]
            argv += ["--routes", peers]
            server = Server(f"{self.name}_s{i}", argv, workdir)
            server.start()
            servers.append(server)
        self._server, self._others = servers[0], servers[1:]
        for server, port in zip(servers, ports, strict=True):
            await server.wait_ready(lambda port=port: port_open(port))
        self._url = f"nats://{HOST}:{ports[0]}"
        self._admin = await self._connect()
        await self._wait_jetstream(READY_S)

    async def _wait_jetstream(self, timeout: float) -> None:
        """Until the cluster can place a replicas-3 stream: the account-info request,
        bounded by `PROBE_S`, is answered once a meta leader is elected; then a stream is
        created and deleted with the usual bound (its own replicas elect their leader)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        probe = self._admin.jsm(timeout=PROBE_S)
        while time.monotonic() < deadline:
            try:
                await probe.account_info()
                await self.create_stream("ready")
                await self.drop_stream("ready")
                return
            except (nats.errors.Error, TimeoutError) as err:
                last = err
                await asyncio.sleep(0.2)
        raise TimeoutError(f"{self.name}: JetStream not ready after {timeout} s: {last}")

    async def prepare_streams(self, streams: Sequence[str]) -> None:
        """Creates the run's streams at once, before its first workload (bench/runner.py).

        A replicas-3 stream is answered once its replicas elected their leader, after a
        random campaign delay of 0.1-0.8 s: one after another the eight streams of a run
        took ~3.6 s of it, all at once they take ~0.8 s. Until used they idle, which costs
        the three servers +0.7 % of a core (heartbeats; measured with 7 idle streams)."""
        await asyncio.gather(*(self.create_stream(s, timeout=READY_S) for s in streams))
        self._prepared.update(streams)

    async def create_stream(self, stream: str, timeout: float = 5.0) -> None:
        if stream in self._prepared:
            self._prepared.discard(stream)  # made fresh by `prepare_streams`, unused
            return
        await super().create_stream(stream, timeout)

    async def drop_stream(self, stream: str) -> None:
        self._prepared.discard(stream)
        await super().drop_stream(stream)

    async def stop(self) -> None:
        self._prepared.clear()
        stop_all(self._others)
        self._others = []
        await super().stop()
