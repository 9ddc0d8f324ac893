"""Deliver policies and filters as small constructors over the protocol messages."""

from __future__ import annotations

from google.protobuf.empty_pb2 import Empty

from streamwal.ids import encode_offset
from streamwal.proto import streaming_pb2 as pb


class DeliverPolicy:
    @staticmethod
    def all() -> pb.DeliverPolicy:
        return pb.DeliverPolicy(all=Empty())

    @staticmethod
    def latest() -> pb.DeliverPolicy:
        return pb.DeliverPolicy(latest=Empty())

    @staticmethod
    def start_from(offset: int) -> pb.DeliverPolicy:
        return pb.DeliverPolicy(start_from=pb.MessageID(id=encode_offset(offset)))

    @staticmethod
    def start_after(offset: int) -> pb.DeliverPolicy:
        return pb.DeliverPolicy(start_after=pb.MessageID(id=encode_offset(offset)))


class DeliverFilter:
    @staticmethod
    def time_tick_gt(tick: int) -> pb.DeliverFilter:
        return pb.DeliverFilter(time_tick_gt=pb.DeliverFilterTimeTickGT(time_tick=tick))

    @staticmethod
    def time_tick_gte(tick: int) -> pb.DeliverFilter:
        return pb.DeliverFilter(time_tick_gte=pb.DeliverFilterTimeTickGTE(time_tick=tick))

    @staticmethod
    def vchannel(name: str) -> pb.DeliverFilter:
        return pb.DeliverFilter(vchannel=pb.DeliverFilterVChannel(vchannel=name))
