"""The message-stream vocabulary of seed 001: TsMsg, MsgPosition, MsgPack, repack functions.

Pure data and decision code. A channel here is any name the WAL routes: a pchannel or a
vchannel on it (`<pchannel>_<suffix>`); see docs/decisions-accessor.md.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from streamwal.errors import InvalidArgument
from streamwal.ids import decode_offset, encode_offset
from streamwal.message import DEFAULT_MSG_TYPE, MsgType


@dataclass(frozen=True)
class MsgPosition:
    """Where a stream stands on one channel: after `msg_id` (8-byte big-endian offset),
    whose time tick is `timestamp`; `msg_group` is the subscription that read it."""

    channel_name: str
    msg_id: bytes
    msg_group: str = ""
    timestamp: int = 0

    @property
    def offset(self) -> int:
        return decode_offset(self.msg_id)

    @staticmethod
    def at(channel: str, offset: int, timestamp: int = 0, group: str = "") -> MsgPosition:
        return MsgPosition(channel, encode_offset(offset), group, timestamp)


@dataclass
class TsMsg:
    """One message of a stream. `hash_keys` pick its channel on produce (see `repack`);
    `timestamp` (its time tick) and `position` are set on consume."""

    payload: bytes = b""
    msg_type: int = DEFAULT_MSG_TYPE
    hash_keys: list[int] = field(default_factory=list)
    properties: Mapping[str, str] = field(default_factory=dict)
    timestamp: int = 0
    position: MsgPosition | None = None

    @property
    def begin_ts(self) -> int:
        return self.timestamp

    @property
    def end_ts(self) -> int:
        return self.timestamp

    @property
    def type(self) -> MsgType | int:
        try:
            return MsgType(self.msg_type)
        except ValueError:
            return self.msg_type


@dataclass
class MsgPack:
    """Messages delivered (or produced) together, with the positions around them."""

    begin_ts: int = 0
    end_ts: int = 0
    msgs: list[TsMsg] = field(default_factory=list)
    start_positions: list[MsgPosition] = field(default_factory=list)
    end_positions: list[MsgPosition] = field(default_factory=list)


RepackFunc = Callable[[list[TsMsg], list[list[int]]], dict[int, MsgPack]]


def hash_key(value: str | bytes) -> int:
    """A stable 32-bit hash key for a primary key or any routing value."""
    return zlib.crc32(value.encode() if isinstance(value, str) else value)


def channel_indexes(msgs: list[TsMsg], channel_count: int) -> list[list[int]]:
    """Each message's hash keys bucketed onto `channel_count` channels (Milvus's
    ComputeProduceChannelIndexes)."""
    if channel_count <= 0:
        raise InvalidArgument("the stream has no producer channels (call as_producer first)")
    return [[k % channel_count for k in m.hash_keys] for m in msgs]


def default_repack(msgs: list[TsMsg], keys: list[list[int]]) -> dict[int, MsgPack]:
    """Milvus's DefaultRepackFunc: a message goes to the channel of its first hash key."""
    packs: dict[int, MsgPack] = {}
    for i, (msg, msg_keys) in enumerate(zip(msgs, keys, strict=True)):
        if not msg_keys:
            raise InvalidArgument(f"message {i} has no hash key: the repack cannot place it")
        packs.setdefault(msg_keys[0], MsgPack()).msgs.append(msg)
    return packs


def check_repacked(packs: Mapping[int, MsgPack], channel_count: int) -> None:
    """A user's repack function must name existing channel indexes."""
    bad = sorted(i for i in packs if not 0 <= i < channel_count)
    if bad:
        raise InvalidArgument(
            f"the repack function returned channel indexes {bad}; "
            f"the stream has {channel_count} producer channels"
        )
