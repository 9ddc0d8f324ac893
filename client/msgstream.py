"""MsgStream and TtMsgStream (seed 001) on the WAL accessor, asyncio form.

A channel is any name the WAL routes: a pchannel, or a vchannel on it (messages carry it
and consumers filter on it). `produce` spreads a pack over the producer channels with the
repack function (one atomic batch per channel), `broadcast` sends it to all of them.
`MsgStream.consume` returns what one channel delivered in one frame; `TtMsgStream.consume`
returns one pack per time tick across all its channels (`msgstream_merge.TtMerger`).

    stream = wal.msg_stream()
    await stream.as_producer(["pchannel_0_v1", "pchannel_1_v1"])
    await stream.produce(MsgPack(msgs=[TsMsg(b"x", hash_keys=[hash_key("pk-1")])]))
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from streamwal.client.append import Message
from streamwal.client.consumer_group import GroupConsumer, RoutedGroup
from streamwal.client.msgstream_merge import TtMerger
from streamwal.client.msgstream_types import (
    MsgPack,
    MsgPosition,
    RepackFunc,
    TsMsg,
    channel_indexes,
    check_repacked,
    default_repack,
)
from streamwal.client.node_client import ConsumedMessage
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.errors import InvalidArgument
from streamwal.message import RESERVED_PREFIX, MsgType
from streamwal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streamwal.client.accessor import WALAccessor

EARLIEST, LATEST = "earliest", "latest"


def to_ts_msg(channel: str, group: str, m: ConsumedMessage) -> TsMsg:
    user = {k: v for k, v in m.properties.items() if not k.startswith(RESERVED_PREFIX)}
    return TsMsg(
        payload=m.payload,
        msg_type=m.msg_type,
        properties=user,
        timestamp=m.time_tick,
        position=MsgPosition.at(channel, m.offset, m.time_tick, group),
    )


class MsgStream:
    """Produce to some channels, consume others; see the module docstring."""

    def __init__(self, wal: WALAccessor) -> None:
        self._wal = wal
        self.producer_channels: list[str] = []
        self.consumer_channels: list[str] = []
        self.sub_name = ""
        self._initial = EARLIEST
        self._repack: RepackFunc = default_repack
        self._start: dict[str, MsgPosition] = {}  # where each channel stands
        self._seek: dict[str, MsgPosition] = {}  # seeks not yet applied to a group
        self._tasks: list[asyncio.Task] = []
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=64)

    # -- producing ---------------------------------------------------------------------

    async def as_producer(self, channels: Sequence[str]) -> None:
        for channel in channels:
            await self._wal.wal.resolve(channel)  # fails early on an unknown channel
        self.producer_channels = [*self.producer_channels, *channels]

    def set_repack_func(self, repack: RepackFunc) -> None:
        """`repack(msgs, channel_indexes) -> {channel index: MsgPack}`; the default puts a
        message on the channel of its first hash key (modulo the channel count)."""
        self._repack = repack

    async def produce(self, pack: MsgPack) -> dict[str, list[MsgPosition]]:
        """Spread the pack over the producer channels; one atomic batch per channel.
        Returns each channel's positions of what it got, in pack order."""
        count = len(self.producer_channels)
        packs = self._repack(pack.msgs, channel_indexes(pack.msgs, count))
        check_repacked(packs, count)
        return await self._send({self.producer_channels[i]: p.msgs for i, p in packs.items()})

    async def broadcast(self, pack: MsgPack) -> dict[str, list[MsgPosition]]:
        """Every message of the pack to every producer channel."""
        if not self.producer_channels:
            raise InvalidArgument("the stream has no producer channels (call as_producer first)")
        return await self._send(dict.fromkeys(self.producer_channels, pack.msgs))

    async def _send(self, by_channel: dict[str, list[TsMsg]]) -> dict[str, list[MsgPosition]]:
        async def one(channel: str, msgs: list[TsMsg]) -> list[MsgPosition]:
            batch = [Message(channel, m.payload, m.msg_type, m.properties) for m in msgs]
            results = await self._wal.append_batch(channel, batch, 0)
            return [MsgPosition.at(channel, r.message_id, r.time_tick) for r in results]

        channels = [c for c, msgs in by_channel.items() if msgs]
        sent = await asyncio.gather(*(one(c, by_channel[c]) for c in channels))
        return dict(zip(channels, sent, strict=True))

    # -- consuming ---------------------------------------------------------------------

    async def as_consumer(
        self, channels: Sequence[str], sub_name: str, position: str = EARLIEST
    ) -> None:
        """Consume `channels` as subscription `sub_name` (it names every MsgPosition), from
        the earliest retained message or, with `position="latest"`, only new ones; a
        subscription that exists already continues from its cursor (MsgStream)."""
        if not sub_name:
            raise InvalidArgument("as_consumer needs a subscription name")
        if position not in (EARLIEST, LATEST):
            raise InvalidArgument(f"position must be {EARLIEST!r} or {LATEST!r}, not {position!r}")
        for channel in channels:
            await self._wal.wal.resolve(channel)
        self.consumer_channels = [*self.consumer_channels, *channels]
        self.sub_name = sub_name
        self._initial = position

    async def seek(self, positions: Iterable[MsgPosition]) -> None:
        """Consume each position's channel from just after it (as from a pack's
        end_positions); restarts consumption if it had begun."""
        for pos in positions:
            if pos.channel_name not in self.consumer_channels:
                raise InvalidArgument(f"{pos.channel_name!r} is not a consumer channel")
            self._start[pos.channel_name] = pos
            self._seek[pos.channel_name] = pos
        await self._stop_consumers()

    def _start_consumers(self) -> None:
        if not self.consumer_channels:
            raise InvalidArgument("the stream has no consumer channels (call as_consumer first)")
        self._queue = asyncio.Queue(maxsize=64)
        self._tasks = [
            asyncio.create_task(self._pump(c), name=f"msgstream-{c}")
            for c in self.consumer_channels
        ]

    async def _pump(self, channel: str) -> None:
        """Read one channel into the queue; an error ends up in `consume`."""
        try:
            consumer = await self._open(channel)
            async with consumer:
                while (batch := await consumer.next_batch()) is not None:
                    for item in self._items(channel, batch):
                        await self._queue.put(item)
            await self._queue.put(InvalidArgument(f"channel {channel!r} ended"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._queue.put(exc)

    async def _open(self, channel: str):
        """The subscription's server-side consumer group on the channel: consumers of one
        subscription share its messages (each goes to one of them), and its cursor is
        kept by the node (it survives restarts and moves with the pchannel)."""
        pchannel, vchannel = await self._wal.wal.resolve(channel)
        group = RoutedGroup(
            self._wal.wal,
            pchannel,
            f"{self.sub_name}@{channel}",
            vchannel,
            at_least_once=False,  # a subscription's packs are at-most-once (docs/api.md)
        )
        created = await group.create()
        seek = self._seek.pop(channel, None)
        if seek is not None:
            await group.seek(seek.offset + 1)
        elif created and self._initial == LATEST:
            await group.seek(await self._wal.wal.end_offset(pchannel))
        return GroupConsumer(group)

    def _items(self, channel: str, batch: list[ConsumedMessage]) -> list:
        if not batch:
            return []
        msgs = [to_ts_msg(channel, self.sub_name, m) for m in batch]
        start = self._start.get(channel)
        end = msgs[-1].position
        self._start[channel] = end
        return [
            MsgPack(
                begin_ts=msgs[0].timestamp,
                end_ts=msgs[-1].timestamp,
                msgs=msgs,
                start_positions=[start] if start else [],
                end_positions=[end],
            )
        ]

    async def consume(self, timeout: float | None = None) -> MsgPack:
        """The next pack; raises TimeoutError after `timeout` seconds without one."""
        if not self._tasks:
            self._start_consumers()
        return await asyncio.wait_for(self._next(), timeout)

    async def _next(self) -> MsgPack:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self) -> MsgStream:
        return self

    async def __anext__(self) -> MsgPack:
        return await self.consume()

    async def _stop_consumers(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def close(self) -> None:
        await self._stop_consumers()

    async def __aenter__(self) -> MsgStream:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class TtMsgStream(MsgStream):
    """Consumes one MsgPack per time tick across all its channels, in tick order: every
    message with begin_ts < tick <= end_ts, only once every channel has passed end_ts, and
    never one at or below an already delivered pack's end (the node's idle TimeTicks move
    quiet channels on)."""

    def __init__(self, wal: WALAccessor) -> None:
        super().__init__(wal)
        self._merger: TtMerger | None = None

    def _start_consumers(self) -> None:
        self._merger = TtMerger(self.consumer_channels, self.sub_name, self._start.values())
        super()._start_consumers()

    def _policy(self, channel: str) -> DeliverPolicy:
        start = self._start.get(channel)
        if start is not None:
            return DeliverPolicy.start_after(start.offset)
        return DeliverPolicy.all() if self._initial == EARLIEST else DeliverPolicy.latest()

    async def _open(self, channel: str):
        """A plain routed consumer with TimeTicks: the merge needs every message of every
        channel, so a TtMsgStream never shares a consumer group."""
        assert self._merger is not None
        filters = [DeliverFilter.time_tick_gt(self._merger.last_end)] if self._start else []
        return await self._wal.wal.consumer(
            channel, self._policy(channel), filters, time_ticks=True
        )

    def _items(self, channel: str, batch: list[ConsumedMessage]) -> list:
        return [(channel, m) for m in batch]

    async def _next(self) -> MsgPack:
        merger = self._merger
        assert merger is not None
        while (pack := merger.pop()) is None:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            channel, m = item
            data = None if m.msg_type == MsgType.TimeTick else to_ts_msg(channel, self.sub_name, m)
            merger.push(channel, m.offset, m.time_tick, data)
        for pos in pack.end_positions:
            self._start[pos.channel_name] = pos
        return pack

    async def seek(self, positions: Iterable[MsgPosition]) -> None:
        await super().seek(positions)
        self._merger = None
