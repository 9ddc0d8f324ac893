"""Frames of the node's produce and replication ports (proto/wire.proto): length, kind, body.

Shared by the node's listeners and their clients so both sides agree on one definition of
a frame and of its size limit. A frame that breaks the format raises `FrameError`,
which the node answers with INVAILD_ARGUMENT before it closes the connection.
"""

from __future__ import annotations

import asyncio
import struct

from streamwal.proto import wire_pb2
from streamwal.transport import MAX_FRAME_BYTES

CREATE_PRODUCER = wire_pb2.FRAME_KIND_CREATE_PRODUCER
PRODUCE_REQUEST = wire_pb2.FRAME_KIND_PRODUCE_REQUEST
PRODUCE_RESPONSE = wire_pb2.FRAME_KIND_PRODUCE_RESPONSE
ERROR = wire_pb2.FRAME_KIND_ERROR
REPLICA_ACK = wire_pb2.FRAME_KIND_REPLICA_ACK
LOG_ENTRY = wire_pb2.FRAME_KIND_LOG_ENTRY
KINDS = frozenset(wire_pb2.FrameKind.values()) - {wire_pb2.FRAME_KIND_UNKNOWN}

_HEAD = struct.Struct(">IB")  # body length, frame kind
HEAD_BYTES = _HEAD.size


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class FrameTooLarge(FrameError):
    """A frame's header claims more bytes than the limit: refused before its body is read."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes is over the {limit}-byte limit")
        self.length = length
        self.limit = limit


def frame(kind: int, body: bytes) -> bytes:
    return head(kind, len(body)) + body


def head(kind: int, length: int) -> bytes:
    """The header of a frame whose body of `length` bytes is written after it."""
    return _HEAD.pack(length, kind)


def _check_head(length: int, kind: int, limit: int) -> None:
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if length > limit:
        raise FrameTooLarge(length, limit)


class FrameCutter:
    """Cuts frames out of a byte stream as its chunks arrive.

    For protocols that parse in `data_received`: a frame is handled in the callback that
    delivered its last byte, with no reader task to wake (a task switch per frame costs a
    one-at-a-time producer tens of µs on each side). Holds at most one chunk beyond the
    frames not yet taken, so a caller that stops taking frames should stop reading too.
    """

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self._limit = limit
        self._buf = b""  # frames are cut from here, from `_pos` on
        self._pos = 0
        self._more: list[bytes] = []  # chunks after `_buf`, joined once a frame is whole
        self._more_bytes = 0

    def feed(self, data: bytes) -> None:
        if self._pos == len(self._buf) and not self._more:
            self._buf, self._pos = data, 0
        else:
            self._more.append(data)
            self._more_bytes += len(data)

    def buffered(self) -> int:
        """Bytes held: frames not taken yet, and the part of a frame still arriving."""
        return len(self._buf) - self._pos + self._more_bytes

    def _have(self, n: int) -> bool:
        """Whether `n` bytes are held; if so they start at `_pos` of `_buf`."""
        if len(self._buf) - self._pos >= n:
            return True
        if self.buffered() < n:
            return False
        self._buf = b"".join([memoryview(self._buf)[self._pos :], *self._more])
        self._pos, self._more, self._more_bytes = 0, [], 0
        return True

    def next(self) -> tuple[int, memoryview] | None:
        """The next whole (kind, body), or None until more bytes arrive.

        The body is a view of the bytes received, not a copy: a frame is parsed from it
        at once (protobuf copies what it keeps). A 256 KiB frame of 4 KiB messages was
        copied twice here before (the rest of a chunk, then the body), into fresh memory
        each time (docs/benchmarks.md, "Large messages")."""
        if not self._have(HEAD_BYTES):
            return None
        length, kind = _HEAD.unpack_from(self._buf, self._pos)
        _check_head(length, kind, self._limit)
        if not self._have(HEAD_BYTES + length):
            return None
        start = self._pos + HEAD_BYTES
        self._pos = start + length
        return kind, memoryview(self._buf)[start : self._pos]

    def check_ended(self) -> None:
        """At the end of the stream: FrameError if it stopped inside a frame."""
        held = self.buffered()
        if not held:
            return
        if held < HEAD_BYTES:
            raise FrameError(f"connection closed inside a frame header ({held} bytes)")
        self._have(HEAD_BYTES)
        length, _ = _HEAD.unpack_from(self._buf, self._pos)
        raise FrameError(
            f"connection closed inside a frame ({held - HEAD_BYTES} of {length} bytes)"
        )


class FramedProtocol(asyncio.Protocol):
    """What both ends of the produce and replication ports share: frames cut as bytes
    arrive (`cutter`, `next_frame`), the peer's end of input (`eof`) handed to the
    owner's `_pump` as more frames would be, reading paused while the owner holds frames
    back, and writes that wait while the transport's buffer is over its high-water mark."""

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self.transport: asyncio.Transport | None = None
        self.cutter = FrameCutter(limit)
        self.eof = False  # no more bytes will arrive (the peer closed, or the connection)
        self.lost = False
        self._reading_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.eof = True
        self._writable.set()  # a drain waiting for the peer ends (with an error)

    def eof_received(self) -> bool:
        self.eof = True
        self._pump()
        return False  # the peer is done: the connection closes

    def _pump(self) -> None:
        """Act on the frames that arrived (and on `eof`): the owner's."""
        raise NotImplementedError

    def next_frame(self) -> tuple[int, memoryview] | None:
        """The next whole (kind, body); None until more bytes arrive, or at a clean end
        once `eof`; FrameError (FrameTooLarge) for a frame refused or input that ended
        inside a frame."""
        got = self.cutter.next()
        if got is None and self.eof:
            self.cutter.check_ended()
        return got

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def hold_reading(self, hold: bool) -> None:
        """Stop (True) or restart reading the socket: TCP then holds the peer back."""
        if hold != self._reading_paused and not self.lost:
            self._reading_paused = hold
            (self.transport.pause_reading if hold else self.transport.resume_reading)()

    def can_write_now(self) -> bool:
        """Whether a frame written now goes out at once (nothing buffered before it)."""
        return not self.transport.is_closing() and not self.transport.get_write_buffer_size()

    async def drain(self) -> None:
        await self._writable.wait()
        if self.lost:
            raise ConnectionResetError("the connection is gone")


async def read_frame(
    reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES
) -> tuple[int, bytes] | None:
    """The next (kind, body); None when the peer closed between frames."""
    try:
        head = await reader.readexactly(HEAD_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(
            f"connection closed inside a frame header ({len(exc.partial)} bytes)"
        ) from None
    length, kind = _HEAD.unpack(head)
    _check_head(length, kind, limit)
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"connection closed inside a frame ({len(exc.partial)} of {length} bytes)"
        ) from None
