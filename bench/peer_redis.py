"""Redis Streams as a peer: `redis-server` with AOF, client `redis` (asyncio, hiredis).

Fastest honest use: XADD pipelined without MULTI (one round trip per batch), XREAD with
COUNT for the catch-up and the live tail, one connection per producer. The replicated
peer (`redis_r3`) is a primary with two replicas and `WAIT 1` at the end of each
pipeline, still one round trip: a batch is acknowledged once one replica has it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import redis.asyncio as aioredis

from streamwal.bench.procs import HOST, OneServer, Server, port_open, stop_all
from streamwal.testing.local_node import free_port

_DURABILITY = {
    "everysec": "AOF appendfsync everysec: acked once in the OS, fsync once a second "
    "(a crash of the machine may lose up to ~1 s of acked messages)",
    "always": "AOF appendfsync always: fsync of the AOF before replies are sent "
    "(one fsync per event-loop round, shared by the clients in it)",
}
REPLICATED = (
    "primary + 2 replicas, AOF everysec on each: acked once the primary and 1 replica hold "
    "it in memory (WAIT 1 after each pipeline); nobody fsyncs before the ack"
)
WAIT_MS = 5000  # WAIT's own bound: fewer replicas than asked by then is an error
MAX_CONNECTIONS = 5000  # one per outstanding open-loop send at most (Plan.max_in_flight)


class ReplicaMissing(RuntimeError):
    """WAIT returned before a replica had the batch: the ack would not mean what it says."""


class RedisProducer:
    def __init__(self, client: aioredis.Redis, stream: str, wait_replicas: int = 0) -> None:
        self._client = client
        self._stream = stream
        self._wait = wait_replicas

    async def send_batch(self, payloads: list[bytes]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(self._stream, {"d": p})
        if self._wait:
            pipe.execute_command("WAIT", self._wait, WAIT_MS)
        replies = await pipe.execute()
        if self._wait and replies[-1] < self._wait:
            raise ReplicaMissing(f"WAIT {self._wait}: {replies[-1]} replica(s) acknowledged")

    async def send_one(self, payload: bytes) -> None:
        await self.send_batch([payload])

    async def close(self) -> None:
        await self._client.aclose()


class RedisReader:
    def __init__(self, client: aioredis.Redis, stream: str, batch: int) -> None:
        self._client = client
        self._stream = stream
        self._batch = batch
        self._last = b"0-0"

    async def next_batch(self, timeout: float) -> list[bytes]:
        reply = await self._client.xread(
            {self._stream: self._last}, count=self._batch, block=max(1, int(timeout * 1000))
        )
        if not reply:
            return []
        entries = reply[0][1]
        self._last = entries[-1][0]
        return [fields[b"d"] for _, fields in entries]

    async def close(self) -> None:
        await self._client.aclose()


class RedisStreams(OneServer):
    """One redis-server per instance, AOF on, RDB snapshots off, in a temp dir."""

    def __init__(self, fsync: str = "everysec") -> None:
        if fsync not in _DURABILITY:
            raise ValueError(f"appendfsync {fsync!r} is not one of {sorted(_DURABILITY)}")
        self.fsync = fsync
        self.wait_replicas = 0
        self.primary_args: tuple[str, ...] = ()  # more redis-server flags for the primary
        self.name = "redis" if fsync == "everysec" else f"redis_{fsync}"
        self.durability = _DURABILITY[fsync]
        self._server: Server | None = None
        self._port = 0
        self._admin: aioredis.Redis | None = None

    def _client(self) -> aioredis.Redis:
        # redis-py runs concurrent commands on connections of its pool. With a small cap,
        # the open loop's sends during a server stall (an AOF rewrite's fork, a loaded
        # machine) fail with MaxConnectionsError instead of waiting; redis-py 8 caps the
        # pool at 100 unless told, so the cap is the open loop's own (Plan.max_in_flight).
        return aioredis.Redis(host=HOST, port=self._port, max_connections=MAX_CONNECTIONS)

    def _argv(self, port: int, workdir: Path, *extra: str) -> list[str]:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        return [
            binary,
            "--bind",
            HOST,
            "--port",
            str(port),
            "--dir",
            str(workdir),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.fsync,
            "--save",
            "",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *extra,
        ]

    async def start(self, workdir: Path) -> None:
        self._port = free_port()
        argv = self._argv(self._port, workdir, *self.primary_args)
        self._server = Server(self.name, argv, workdir)
        self._server.start()
        await self._server.wait_ready(lambda: port_open(self._port))
        self._admin = self._client()
        await self._server.wait_ready(self._admin.ping)

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.aclose()
            self._admin = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def create_stream(self, stream: str) -> None:
        await self.drop_stream(stream)

    async def drop_stream(self, stream: str) -> None:
        assert self._admin is not None
        await self._admin.delete(stream)

    async def producer(self, stream: str) -> RedisProducer:
        return RedisProducer(self._client(), stream, self.wait_replicas)

    async def reader(self, stream: str, batch: int) -> RedisReader:
        return RedisReader(self._client(), stream, batch)


class RedisReplicated(RedisStreams):
    """`redis_r3`: a primary and two replicas (`replicaof`), each its own process and
    directory; producers write to the primary and WAIT for one replica, readers read the
    primary (as the other peers' readers read their leader)."""

    def __init__(self) -> None:
        super().__init__("everysec")
        self.name = "redis_r3"
        self.durability = REPLICATED
        self.wait_replicas = 1
        # Redis 7 waits 5 s for more replicas before a diskless full sync: the two start
        # together, so sync at once (the replicas were online 5 s after start, now ~0.1 s).
        self.primary_args = ("--repl-diskless-sync-delay", "0")
        self._replicas: list[Server] = []

    async def start(self, workdir: Path) -> None:
        primary = workdir / "primary"
        primary.mkdir(exist_ok=True)
        await super().start(primary)
        for i in (1, 2):
            home = workdir / f"replica{i}"
            home.mkdir(exist_ok=True)
            port = free_port()
            argv = self._argv(port, home, "--replicaof", HOST, str(self._port))
            server = Server(f"{self.name}_replica{i}", argv, home)
            server.start()
            self._replicas.append(server)
            await server.wait_ready(lambda port=port: port_open(port))
        await self._wait_replicas_online(20.0)

    async def _wait_replicas_online(self, timeout: float) -> None:
        assert self._admin is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await self._admin.info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            if sum(1 for v in online if v.get("state") == "online") == 2:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name}: 2 replicas not online after {timeout} s")

    async def stop(self) -> None:
        stop_all(self._replicas)
        self._replicas = []
        await super().stop()
