"""Time ticks on a real node: idle pchannels keep ticking, and consumers may skip the ticks."""

from __future__ import annotations

import asyncio
import itertools
import time

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.node.clock import physical_ms
from tests.node.helpers import RawConsumer, is_tick, read_through


async def test_idle_pchannel_ticks_and_tick_filters_progress(client, node, pchannel) -> None:
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    r = await producer.send(b"only")
    # Nobody takes ticks yet: none are written (they cost per reader, not per pchannel).
    await asyncio.sleep(0.6)
    opened_ms = time.time() * 1000
    # A time-tick consumer past the only message still sees time move (default 200 ms).
    consumer = await client.consumer(
        pchannel, 1, DeliverPolicy.all(), [DeliverFilter.time_tick_gt(r.time_tick)], time_ticks=True
    )
    ticks = []
    deadline = time.monotonic() + 10
    async for m in consumer:
        assert is_tick(m) and m.time_tick > r.time_tick, m
        assert "_vc" not in m.properties and m.properties["_t"] == "1200"
        ticks.append(m.time_tick)
        if len(ticks) == 4 or time.monotonic() > deadline:
            break
    await consumer.close()
    assert len(ticks) == 4 and ticks == sorted(ticks)
    # The first came for this reader (none was written while nobody took ticks).
    assert physical_ms(ticks[0]) >= opened_ms - 50
    gaps = [physical_ms(b) - physical_ms(a) for a, b in itertools.pairwise(ticks)]
    assert all(100 <= g <= 1500 for g in gaps), gaps
    assert abs(physical_ms(ticks[-1]) - time.time() * 1000) < 5000
    # A seed-style consumer gets ticks as ordinary messages with `_t` = 1200.
    raw = RawConsumer(node.address, pchannel, 1, DeliverPolicy.start_after(r.offset))
    await raw.open()
    m = await raw.next(5)
    assert m.is_tick and int(m.properties["_tt"]) > r.time_tick
    await raw.close()
    await producer.close()


async def test_busy_pchannel_does_not_get_ticks_between_appends(start_node, pchannel) -> None:
    node = start_node("n1", "--time-tick-interval", "300ms")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        # A reader that takes ticks is there throughout: idle, the pchannel ticks for it.
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=True)
        msgs = [await asyncio.wait_for(consumer.__anext__(), 10)]
        assert is_tick(msgs[0])
        producer = await c.producer(pchannel, 1)
        for i in range(20):
            await producer.send(b"%d" % i)
            await asyncio.sleep(0.02)

        async def through_data() -> None:
            async for m in consumer:
                msgs.append(m)
                if m.payload == b"19":
                    return

        await asyncio.wait_for(through_data(), 10)
        await consumer.close()
        await producer.close()
    first = next(i for i, m in enumerate(msgs) if not is_tick(m))
    between = msgs[first:]
    assert [m.payload for m in between] == [b"%d" % i for i in range(20)], (
        "ticks appended while the pchannel was busy"
    )


async def test_consumers_skip_time_ticks_unless_asked(client, pchannel) -> None:
    """Without ticks by default (as the routed consumers); `time_ticks=True` delivers them."""
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    await producer.send(b"a", vchannel=pchannel + "_v1")
    reader = await client.consumer(pchannel, 1, DeliverPolicy.latest(), time_ticks=True)
    await asyncio.sleep(0.7)  # a few ticks land in between, for the reader that takes them
    await reader.close()
    await producer.send(b"b", vchannel=pchannel + "_v2")
    last = await producer.send(b"c", vchannel=pchannel + "_v1")
    for filters, expected in (
        ([], [b"a", b"b", b"c"]),
        ([DeliverFilter.vchannel(pchannel + "_v1")], [b"a", b"c"]),
    ):
        consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), filters)
        got = []

        async def take(consumer=consumer, got=got) -> None:
            async for m in consumer:
                got.append(m)
                if m.payload == b"c":
                    return

        await asyncio.wait_for(take(), 10)
        await consumer.close()
        assert [m.payload for m in got] == expected
        offsets = [m.offset for m in got]
        assert offsets == sorted(offsets) and offsets[-1] - offsets[0] > len(got) - 1  # gaps
    with_ticks = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=True)
    seen = await read_through(with_ticks, last.offset)
    await with_ticks.close()
    assert [m.payload for m in seen if not is_tick(m)] == [b"a", b"b", b"c"]
    assert [m.offset for m in seen] == list(range(seen[0].offset, last.offset + 1))  # dense
    assert any(is_tick(m) for m in seen)
    await producer.close()
