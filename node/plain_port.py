"""What the node's two plain-TCP listeners (the produce and replication ports) do alike:
listen, count connections against the limits, keep their streams' tasks and cut them at
stop after a grace; and with a connection's frames: cut the next one, with the node's
answer to a frame over the size limit or not of the protocol, and charge what is held in
part to the node's receive buffer."""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

from streamwal import wire
from streamwal.errors import InvalidArgument
from streamwal.node.config import NodeConfig
from streamwal.node.limits import LimitExceeded, PeerCounts, ReceiveBuffer

CLOSE_GRACE_S = 1.0  # a refused connection's last frames get this long to go out
BACKLOG = 1024  # connections the kernel queues for accept (asyncio's default is 100)
# A peer silent this long (s) is probed, and given this long to answer: gRPC's keepalive
# (common/transport.py), so a replication stream over a partitioned link ends as a gRPC
# one would, and the follower reconnects once it heals.
KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 10, 5


class Connection(Protocol):
    peer: str  # the peer's address, once counted against the connection limits
    opened_at: float  # loop time
    charged: int  # bytes held in part, charged to the node's receive buffer


def keep_alive(transport: asyncio.BaseTransport) -> None:
    """Give up on a peer that stops answering: TCP keepalive probes when the connection is
    idle, and a bound on how long sent data may stay unacknowledged (TCP_USER_TIMEOUT)
    when it is not; either way the connection is lost within ~15 s instead of TCP's
    retransmissions for many minutes. Linux; elsewhere only SO_KEEPALIVE."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_TIMEOUT_S),
        ("TCP_KEEPCNT", 1),
        ("TCP_USER_TIMEOUT", (KEEPALIVE_S + KEEPALIVE_TIMEOUT_S) * 1000),
    ):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def next_frame(conn: wire.FramedProtocol, port: str) -> tuple[int, memoryview] | None:
    """`conn`'s next whole (kind, body), None until more bytes arrive (or at a clean end);
    the node's answer to a frame refused: LimitExceeded or InvalidArgument (naming
    `port`)."""
    try:
        return conn.next_frame()
    except wire.FrameTooLarge as exc:
        raise LimitExceeded(
            "frame_size", f"a frame of {exc.length} bytes is over the limit"
        ) from None
    except wire.FrameError as exc:
        raise InvalidArgument(f"malformed {port} frame: {exc}") from None


def charge(buffer: ReceiveBuffer, charged: int, held: int) -> int:
    """A connection's charge for the `held` bytes of its frames still arriving (it was
    `charged`); LimitExceeded when the node's receive buffer cannot take them."""
    if held != charged and not buffer.resize(charged, held):
        raise LimitExceeded(
            "receive_buffer",
            f"the node holds {buffer.used} bytes of frames still arriving, its limit",
        )
    return held


class PlainPort:
    """One plain-TCP listener: its connections (each made by `_connect`) counted in total
    and per peer address, the tasks of their streams, and a watcher task (`_watch`)."""

    def __init__(self, config: NodeConfig, buffer: ReceiveBuffer, what: str) -> None:
        self.config = config
        self.counts = PeerCounts(
            config.max_connections,
            config.max_connections_per_peer,
            "connections",
            "connections_per_peer",
            f"{what} connections",
        )
        self.buffer = buffer  # the node's, shared by both ports
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.Task] = set()
        # every counted connection -> (its progress, since when it has not moved)
        self._open: dict[Connection, tuple[int, float]] = {}
        self._watcher: asyncio.Task | None = None
        self.stopping = False
        self.port = 0

    def _connect(self) -> asyncio.Protocol:
        raise NotImplementedError

    async def _watch(self) -> None:
        raise NotImplementedError

    async def start(self, host: str | None, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connect, host, port, reuse_address=True, backlog=BACKLOG
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._watcher = asyncio.ensure_future(self._watch())
        return self.port

    def admit(self, conn: Connection, peer: str) -> None:
        """Count `conn` from `peer`, or raise LimitExceeded (nothing counted)."""
        self.counts.admit(peer)
        conn.peer = peer
        self._open[conn] = (0, conn.opened_at)

    def closed(self, conn: Connection) -> None:
        if self._open.pop(conn, None) is not None:
            self.counts.release(conn.peer)
        self.buffer.resize(conn.charged, 0)
        conn.charged = 0

    def opened(self, task: asyncio.Task) -> None:
        """A connection's stream runs in `task` (cut at `stop` after the grace)."""
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def stop(self, grace: float) -> None:
        """Stop accepting; give open streams `grace` seconds to finish (as gRPC gives its
        calls), then cut them."""
        if self._server is None:
            return
        self.stopping = True
        self._server.close()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._streams:
            _, late = await asyncio.wait(self._streams, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        self._server = None
