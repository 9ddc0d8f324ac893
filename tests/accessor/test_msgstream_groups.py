"""MsgStream subscriptions are server-side consumer groups: two consumers of one
subscription share its messages (each message to exactly one of them), and a
subscription opened again continues from its cursor."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.client.aio import MsgPack, TsMsg, connect

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_shared_subscription_delivers_each_message_to_exactly_one(cluster) -> None:
    channels = [f"{cluster.pchannels[0]}_grp", f"{cluster.pchannels[1]}_grp"]
    async with await connect(coord=cluster.coord_address) as wal:
        producer = wal.msg_stream()
        await producer.as_producer(channels)
        one, two = wal.msg_stream(), wal.msg_stream()
        await one.as_consumer(channels, "shared")
        await two.as_consumer(channels, "shared")
        got: dict[str, list[bytes]] = {"one": [], "two": []}
        total = 200

        async def consume(name: str, stream) -> None:
            while sum(map(len, got.values())) < total:
                try:
                    pack = await stream.consume(timeout=0.2)
                except TimeoutError:
                    continue
                got[name] += [m.payload for m in pack.msgs]

        readers = [asyncio.create_task(consume(n, s)) for n, s in (("one", one), ("two", two))]
        for r in range(20):  # rounds, so both consumers are polling while messages arrive
            msgs = [TsMsg(b"%d" % (r * 10 + i), hash_keys=[i]) for i in range(10)]
            await producer.produce(MsgPack(msgs=msgs))
            await asyncio.sleep(0.06)
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.gather(*readers)
        print(f"\nshared subscription: one took {len(got['one'])}, two took {len(got['two'])}")
        assert not set(got["one"]) & set(got["two"]), "a message went to both consumers"
        assert sorted(got["one"] + got["two"]) == sorted(b"%d" % i for i in range(total))
        assert got["one"] and got["two"], "one consumer did all the work"

        # The subscription's cursor is on the node: opened again, it has nothing old.
        # The first two close first: their pumps would otherwise keep polling the group
        # and could take the fresh message themselves.
        await asyncio.gather(one.close(), two.close())
        await producer.produce(MsgPack(msgs=[TsMsg(b"fresh", hash_keys=[1])]))
        again = wal.msg_stream()
        await again.as_consumer(channels, "shared")
        pack = await again.consume(timeout=10)
        assert [m.payload for m in pack.msgs] == [b"fresh"]
        assert pack.end_positions[0].msg_group == "shared"
        await asyncio.gather(producer.close(), again.close())
