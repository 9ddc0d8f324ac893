"""TtMsgStream across kill -9 of one channel's owner: packs stay ordered and complete, and
no message arrives at or below a delivered pack's end (ticks grow across terms)."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.aio import MsgPack, TsMsg, connect
from tests.support import wait_for


@pytest.mark.slow
async def test_tt_msg_stream_survives_a_kill_9_of_an_owner(make_cluster) -> None:
    cluster = await make_cluster(nodes=2, grace=10.0)
    pchannels = await cluster.create_channels(2)
    channels = [f"{p}_ttf" for p in pchannels]
    async with await connect(coord=cluster.coord_address, failover_timeout=60) as wal:
        for p in pchannels:
            await wal.wal.resolve(p)
        owners = {wal.wal.assignments()[p].server_id for p in pchannels}
        stream = wal.tt_msg_stream()
        await stream.as_consumer(channels, "tt-failover")
        producer = wal.msg_stream()
        await producer.as_producer(channels)
        acked: list[bytes] = []
        stop = asyncio.Event()
        produced = asyncio.Event()  # the last produce returned: `acked` is final

        async def produce() -> None:
            i = 0
            try:
                while not stop.is_set():
                    msgs = [TsMsg(b"%d" % (i + k), hash_keys=[i + k]) for k in range(2)]
                    await producer.produce(MsgPack(msgs=msgs))
                    acked.extend(m.payload for m in msgs)
                    i += 2
                    await asyncio.sleep(0.005)
            finally:
                produced.set()

        packs: list[MsgPack] = []
        delivered: list[bytes] = []

        async def consume() -> None:
            while not (produced.is_set() and len(delivered) >= len(acked)):
                try:
                    pack = await stream.consume(timeout=1)
                except TimeoutError:
                    continue  # nothing new yet: look at `produced` again
                packs.append(pack)
                delivered.extend(m.payload for m in pack.msgs)

        work = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        await wait_for(lambda: len(delivered) >= 200, 30, what="200 delivered before the kill")
        victim = wal.wal.assignments()[pchannels[0]]
        cluster.kill_node(victim.server_id)
        await asyncio.sleep(0.5)
        await cluster.start_node(victim.server_id)
        await wait_for(
            lambda: getattr(wal.wal.assignments().get(pchannels[0]), "term", 0) > victim.term,
            60,
            what="the pchannel under a new term",
        )
        settled = len(acked)
        await wait_for(lambda: len(acked) >= settled + 200, 60, what="200 acks after the move")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*work), 90)

        end = 0
        for pack in packs:
            assert pack.begin_ts == end < pack.end_ts
            ticks = [m.timestamp for m in pack.msgs]
            assert all(end < t <= pack.end_ts for t in ticks) and ticks == sorted(ticks)
            end = pack.end_ts
        assert sorted(delivered) == sorted(acked) and len(set(delivered)) == len(acked)
        print(f"\ntt stream across a kill -9: {len(packs)} packs, {len(delivered)} messages, "
              f"owners {sorted(owners)}")  # fmt: skip
        await asyncio.gather(stream.close(), producer.close())
