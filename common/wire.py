"""Frames of the node's produce port (proto/wire.proto): length, kind, body.

Shared by the node's listener and the client so both sides agree on one definition of
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
KINDS = frozenset(wire_pb2.FrameKind.values()) - {wire_pb2.FRAME_KIND_UNKNOWN}

_HEAD = struct.Struct(">IB")  # body length, frame kind
HEAD_BYTES = _HEAD.size


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body), kind) + body


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
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if length > limit:
        raise FrameError(f"frame of {length} bytes is over the {limit}-byte limit")
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"connection closed inside a frame ({len(exc.partial)} of {length} bytes)"
        ) from None
