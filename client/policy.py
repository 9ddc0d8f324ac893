"""Where a read starts (DeliverPolicy) and what it lets through (DeliverFilter).

They are the client's own small values, not the protocol's messages: a public signature
that took `pb.DeliverPolicy` tied every caller to the generated code (and let a half-built
message through). They become protobuf in one place, where a consumer opens its stream
(`to_proto`, client/node_client.py). See docs/decisions-client.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from google.protobuf.empty_pb2 import Empty

from streamwal.ids import encode_offset
from streamwal.proto import streaming_pb2 as pb


@dataclass(frozen=True)
class DeliverPolicy:
    """Build one with `all()`, `latest()`, `start_from(offset)` or `start_after(offset)`."""

    kind: Literal["all", "latest", "start_from", "start_after"]
    offset: int = 0  # of start_from / start_after

    @classmethod
    def all(cls) -> DeliverPolicy:
        """From the oldest retained message."""
        return cls("all")

    @classmethod
    def latest(cls) -> DeliverPolicy:
        """From the last message in the log (Milvus's DeliverPolicy latest)."""
        return cls("latest")

    @classmethod
    def start_from(cls, offset: int) -> DeliverPolicy:
        """From `offset` (its message included)."""
        return cls("start_from", offset)

    @classmethod
    def start_after(cls, offset: int) -> DeliverPolicy:
        """From just after `offset`."""
        return cls("start_after", offset)

    def to_proto(self) -> pb.DeliverPolicy:
        if self.kind in ("all", "latest"):
            return pb.DeliverPolicy(**{self.kind: Empty()})
        return pb.DeliverPolicy(**{self.kind: pb.MessageID(id=encode_offset(self.offset))})


@dataclass(frozen=True)
class DeliverFilter:
    """Build one with `time_tick_gt(tick)`, `time_tick_gte(tick)` or `vchannel(name)`."""

    kind: Literal["time_tick_gt", "time_tick_gte", "vchannel"]
    value: int | str

    @classmethod
    def time_tick_gt(cls, tick: int) -> DeliverFilter:
        """Only messages whose time tick is above `tick`."""
        return cls("time_tick_gt", tick)

    @classmethod
    def time_tick_gte(cls, tick: int) -> DeliverFilter:
        """Only messages whose time tick is at least `tick`."""
        return cls("time_tick_gte", tick)

    @classmethod
    def vchannel(cls, name: str) -> DeliverFilter:
        """Only the messages of vchannel `name`."""
        return cls("vchannel", name)

    def to_proto(self) -> pb.DeliverFilter:
        if self.kind == "time_tick_gt":
            return pb.DeliverFilter(time_tick_gt=pb.DeliverFilterTimeTickGT(time_tick=self.value))
        if self.kind == "time_tick_gte":
            return pb.DeliverFilter(time_tick_gte=pb.DeliverFilterTimeTickGTE(time_tick=self.value))
        return pb.DeliverFilter(vchannel=pb.DeliverFilterVChannel(vchannel=self.value))
