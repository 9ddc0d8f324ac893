"""Retention by size and by age on a real node: old records go, appends never wait."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from tests.node.helpers import read_through

CHECK = ("--retention-check-interval", "100ms")


async def _status(c: NodeClient, pch: str):
    (st,) = [s for s in (await c.collect_status()).channels if s.pchannel.name == pch]
    return st


async def _wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")


async def test_size_retention_drops_old_records_without_blocking_appends(
    start_node, pchannel
) -> None:
    node = start_node("n1", *CHECK)
    limit = 64 * 1024
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1, retention_bytes=limit)
        producer = await c.producer(pchannel, 1)
        acked: dict[int, bytes] = {}
        slowest = 0.0
        for i in range(150):  # ~600 KB in 150 records, across several retention passes
            payloads = [b"%d.%d:" % (i, k) + b"r" * 200 for k in range(20)]
            started = time.monotonic()
            results = await asyncio.wait_for(producer.send_many(payloads), 10)
            slowest = max(slowest, time.monotonic() - started)
            acked.update({r.offset: p for r, p in zip(results, payloads, strict=True)})
            if i % 10 == 0:
                await asyncio.sleep(0.05)  # let retention passes interleave with appends
        assert slowest < 2.0, f"an append took {slowest:.2f} s"

        async def trimmed() -> bool:
            st = await _status(c, pchannel)
            return st.first_offset > 0 and st.size_bytes <= limit + 8 * 1024

        await _wait_for(trimmed)
        st = await _status(c, pchannel)
        first, end = st.first_offset, st.next_offset
        assert first > 1000, st  # most of the ~3000 messages are gone

        for policy in (
            DeliverPolicy.start_from(0),
            DeliverPolicy.start_after(5),
            DeliverPolicy.all(),
        ):
            consumer = await c.consumer(pchannel, 1, policy, time_ticks=True)
            assert consumer.first_offset >= first
            msgs = await read_through(consumer, end - 1)
            await consumer.close()
            assert msgs[0].offset == consumer.first_offset, "did not start at the oldest retained"
            assert [m.offset for m in msgs] == list(range(msgs[0].offset, end))
            for m in msgs:
                if m.offset in acked:
                    assert m.payload == acked[m.offset]
        # Appends still work, right after the end.
        r = await producer.send(b"after")
        assert r.offset >= end
        await producer.close()

    node.kill()  # the moved start and the size survive a restart
    node = start_node("n1", *CHECK)
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        st = await _status(c, pchannel)
        assert st.first_offset >= first and st.size_bytes <= limit + 8 * 1024
        assert st.next_offset > r.offset


async def test_age_retention_keeps_only_recent_records(start_node, pchannel) -> None:
    node = start_node("n1", *CHECK, "--time-tick-interval", "100ms")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        old = await producer.send_many([b"old"] * 50)
        # Setting retention with a same-term Assign applies to a pchannel already served.
        await c.assign(pchannel, 1, retention_age_ms=300)

        async def old_gone() -> bool:
            return (await _status(c, pchannel)).first_offset > old[-1].offset

        await _wait_for(old_gone)
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.start_from(0), time_ticks=True)
        assert consumer.first_offset > old[-1].offset
        new = await producer.send(b"new")
        msgs = await read_through(consumer, new.offset)
        await consumer.close()
        assert msgs[0].offset == consumer.first_offset
        assert [m.payload for m in msgs if m.payload] == [b"new"]
        await producer.close()


async def test_retention_never_drops_the_newest_record(start_node, pchannel) -> None:
    node = start_node("n1", *CHECK, "--time-tick-interval", "60s")  # no ticks
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1, retention_bytes=1)
        producer = await c.producer(pchannel, 1)
        await producer.send_many([b"a"] * 10)
        last = await producer.send_many([b"b"] * 10)

        async def one_left() -> bool:
            return (await _status(c, pchannel)).first_offset == last[0].offset

        await _wait_for(one_left)
        await asyncio.sleep(0.5)  # more passes change nothing
        st = await _status(c, pchannel)
        assert (st.first_offset, st.next_offset) == (last[0].offset, last[-1].offset + 1)
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.all())
        msgs = await read_through(consumer, last[-1].offset)
        await consumer.close()
        assert [m.payload for m in msgs] == [b"b"] * 10
        await producer.close()


async def test_retention_forgets_producers_whose_batches_it_cut(start_node, pchannel) -> None:
    """A producer id per Spark task must not leave its window on disk for good: once
    retention has cut every batch a producer's window remembers, the node forgets it,
    and a producer still in the log keeps its sequence."""
    node = start_node("n1", *CHECK)
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1, retention_bytes=32 * 1024)
        for task in range(3):  # short-lived producers, as a Spark sink's tasks are
            old = await c.producer(pchannel, 1, producer_id=f"task-{task}")
            await old.send_many([b"t" * 100] * 5)
            await old.close()
        steady = await c.producer(pchannel, 1, producer_id="steady")
        for i in range(60):  # ~250 KB: several cuts past the tasks' batches
            await steady.send_many([b"%d:" % i + b"s" * 200] * 20)

        async def forgotten() -> bool:
            again = await c.producer(pchannel, 1, producer_id="task-0")
            await again.close()
            return again.last_sequence == 0

        await _wait_for(forgotten)
        for task in (1, 2):
            again = await c.producer(pchannel, 1, producer_id=f"task-{task}")
            assert again.last_sequence == 0
            await again.close()
        assert (await c.producer(pchannel, 1, producer_id="steady")).last_sequence == 60
        await steady.close()
