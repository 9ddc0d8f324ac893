"""Redis Streams as a peer: `redis-server` with AOF, client `redis` (asyncio, hiredis).

Fastest honest use: XADD pipelined without MULTI (one round trip per batch), XREAD with
COUNT for the catch-up and the live tail, one connection per producer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import redis.asyncio as aioredis

from streamwal.bench.procs import HOST, OneServer, Server, free_port, port_open

_DURABILITY = {
    "everysec": "AOF appendfsync everysec: acked once in the OS, fsync once a second "
    "(a crash of the machine may lose up to ~1 s of acked messages)",
    "always": "AOF appendfsync always: fsync of the AOF before replies are sent "
    "(one fsync per event-loop round, shared by the clients in it)",
}


class RedisProducer:
    def __init__(self, client: aioredis.Redis, stream: str) -> None:
        self._client = client
        self._stream = stream

    async def send_batch(self, payloads: list[bytes]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(self._stream, {"d": p})
        await pipe.execute()

    async def send_one(self, payload: bytes) -> None:
        await self._client.xadd(self._stream, {"d": payload})

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
        self.name = "redis" if fsync == "everysec" else f"redis_{fsync}"
        self.durability = _DURABILITY[fsync]
        self._server: Server | None = None
        self._port = 0
        self._admin: aioredis.Redis | None = None

    def _client(self) -> aioredis.Redis:
        # redis-py runs concurrent commands on connections of its pool. With a small cap,
        # the open loop's sends during a server stall (an AOF rewrite's fork) failed with
        # MaxConnectionsError instead of waiting; the default cap is unbounded.
        return aioredis.Redis(host=HOST, port=self._port)

    async def start(self, workdir: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self._port = free_port()
        self._server = Server(
            self.name,
            [
                binary,
                "--bind",
                HOST,
                "--port",
                str(self._port),
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
            ],
            workdir,
        )
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
        return RedisProducer(self._client(), stream)

    async def reader(self, stream: str, batch: int) -> RedisReader:
        return RedisReader(self._client(), stream, batch)
