"""MsgStream and TtMsgStream against a real coord and nodes: produce spreads by hash key
(or a custom repack), broadcast reaches every channel, consume and seek by positions, and
TtMsgStream cuts ordered, complete packs across channels without a late message."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.client.aio import MsgPack, MsgType, TsMsg, connect
from streamwal.errors import InvalidArgument

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def drain(stream, want: int, timeout: float = 15.0) -> list[TsMsg]:
    got: list[TsMsg] = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        pack = await stream.consume(timeout=max(0.1, deadline - time.monotonic()))
        got += pack.msgs
    return got


async def test_produce_repack_broadcast_consume_and_seek(cluster) -> None:
    channels = [f"{p}_ms" for p in cluster.pchannels]
    async with await connect(coord=cluster.coord_address) as wal:
        producer = wal.msg_stream()
        await producer.as_producer(channels)
        msgs = [TsMsg(f"m{i}".encode(), hash_keys=[i]) for i in range(12)]
        placed = await producer.produce(MsgPack(msgs=msgs))
        # The default repack: channel = first hash key modulo the channel count.
        assert {c: len(p) for c, p in placed.items()} == dict.fromkeys(channels, 4)
        with pytest.raises(InvalidArgument, match="no hash key"):
            await producer.produce(MsgPack(msgs=[TsMsg(b"nowhere")]))

        producer.set_repack_func(lambda ms, keys: {1: MsgPack(msgs=ms)})
        placed = await producer.produce(MsgPack(msgs=[TsMsg(b"r0"), TsMsg(b"r1")]))
        assert list(placed) == [channels[1]]
        await producer.broadcast(MsgPack(msgs=[TsMsg(b"all", msg_type=MsgType.Delete)]))

        consumer = wal.msg_stream()
        await consumer.as_consumer(channels, "sub-a")
        got = await drain(consumer, 12 + 2 + 3)
        by_channel: dict[str, list[bytes]] = {}
        for m in got:
            assert m.position.msg_group == "sub-a" and m.timestamp == m.position.timestamp
            by_channel.setdefault(m.position.channel_name, []).append(m.payload)
        for k, channel in enumerate(channels):
            expected = [f"m{i}".encode() for i in range(12) if i % 3 == k]
            expected += [b"r0", b"r1"] if k == 1 else []
            assert by_channel[channel] == [*expected, b"all"]
        assert [m.type for m in got if m.payload == b"all"] == [MsgType.Delete] * 3

        # Seek: from just after m4 on channel 1 (and the other channels' ends).
        m4 = next(m for m in got if m.payload == b"m4")
        ends = {m.position.channel_name: m.position for m in got}
        again = wal.msg_stream()
        await again.as_consumer(channels, "sub-b")
        await again.seek([m4.position, ends[channels[0]], ends[channels[2]]])
        await producer.produce(MsgPack(msgs=[TsMsg(b"new")]))  # the custom repack: channel 1
        rest = await drain(again, 6)
        assert [m.payload for m in rest] == [b"m7", b"m10", b"r0", b"r1", b"all", b"new"]
        assert {m.position.channel_name for m in rest} == {channels[1]}
        await asyncio.gather(producer.close(), consumer.close(), again.close())


async def test_tt_msg_stream_packs_are_ordered_complete_and_never_late(cluster) -> None:
    channels = [f"{p}_tt" for p in cluster.pchannels]
    async with await connect(coord=cluster.coord_address) as wal:
        stream = wal.tt_msg_stream()
        await stream.as_consumer(channels, "tt-sub")
        producer = wal.msg_stream()
        await producer.as_producer(channels)
        sent = 0

        async def produce_for(seconds: float) -> None:
            nonlocal sent
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                # Small packs to every channel, at varying rates per channel.
                msgs = [TsMsg(f"p{sent + i}".encode(), hash_keys=[(sent + i) % 5 % 3])
                        for i in range(4)]  # fmt: skip
                await producer.produce(MsgPack(msgs=msgs))
                sent += len(msgs)
                await asyncio.sleep(0.01)

        work = asyncio.create_task(produce_for(1.5))
        packs: list[MsgPack] = []
        delivered: list[TsMsg] = []
        while not work.done() or len(delivered) < sent:
            pack = await stream.consume(timeout=10)
            packs.append(pack)
            delivered += pack.msgs
        await work

        end = 0
        for pack in packs:
            assert pack.begin_ts == end < pack.end_ts, "packs follow each other"
            ticks = [m.timestamp for m in pack.msgs]
            assert all(t > end for t in ticks), "a message at or below a delivered pack's end"
            assert all(t <= pack.end_ts for t in ticks)
            assert ticks == sorted(ticks)
            assert {p.channel_name for p in pack.end_positions} <= set(channels)
            end = pack.end_ts
        payloads = [m.payload for m in delivered]
        assert sorted(payloads) == sorted(f"p{i}".encode() for i in range(sent))
        assert len(set(payloads)) == len(payloads) == sent
        assert len({m.position.channel_name for m in delivered}) == 3
        assert len(packs) > 3, "one pack per time tick, not one at the end"
        await asyncio.gather(stream.close(), producer.close())
