"""The routed client against a real coord and real nodes: it learns assignments from
AssignmentDiscover, follows graceful moves (drain, with catch-up) without losing,
doubling or reordering acknowledged messages, and its consumers resume after a move."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.wal import open_wal
from streamwal.testing.dev import ProducerRun, produce_range, verify
from tests.support import wait_for


async def test_discovery_driven_routing_picks_up_new_pchannels(make_cluster) -> None:
    cluster = await make_cluster(nodes=2)
    async with await open_wal(cluster.coord_address) as wal:
        assert wal.assignments() == {}
        first_version = wal.watcher.version
        names = await cluster.create_channels(3)
        # The client learns the new pchannels from the coord's push, nothing else.
        producers = {n: await wal.producer(n) for n in names}
        assert set(wal.assignments()) == set(names)
        assert wal.watcher.version > first_version
        for name, producer in producers.items():
            result = await producer.send(name.encode())
            assert result.offset >= 0
            await producer.close()

        # A vchannel routes to its pchannel; its consumer sees only its own messages.
        vchannel = f"{names[1]}_v7"
        tagged = await wal.producer(vchannel)
        assert tagged.pchannel == names[1]
        await tagged.send(b"in v7")
        await tagged.close()
        end = await wal.end_offset(names[1])
        consumer = await wal.consumer(vchannel, end_offset=end)
        got = [(m.payload, m.vchannel) async for m in consumer]
        await consumer.close()
        assert got == [(b"in v7", vchannel)]


async def test_producing_across_a_drain_keeps_every_ack_once_and_in_order(make_cluster) -> None:
    cluster = await make_cluster(nodes=3)
    names = await cluster.create_channels(2)
    async with await open_wal(cluster.coord_address) as wal:
        for name in names:
            await wal.resolve(name)
        # Two producers on each pchannel, interleaving.
        runs = [
            ProducerRun(f"{n}-p{k}", n, await wal.producer(n, producer_id=f"{n}-p{k}"))
            for n in names
            for k in range(2)
        ]
        victim = wal.assignments()[names[0]]
        acked = 0
        third = asyncio.Event()

        def tick() -> None:
            nonlocal acked
            acked += 1
            if acked >= 1500:
                third.set()

        deadline = time.monotonic() + 60
        work = asyncio.gather(*(produce_range(r, 0, 1500, tick, deadline) for r in runs))
        await asyncio.wait_for(third.wait(), 30)
        await cluster.drain(victim.server_id)  # graceful: Remove, then Assign with catch-up
        await asyncio.wait_for(work, 60)
        for run in runs:
            await run.producer.close()

        moved = wal.assignments()[names[0]]
        assert moved.server_id != victim.server_id and moved.term > victim.term
        rerouted = [r for r in runs if r.pchannel == names[0]]
        assert all(r.producer.reroutes for r in rerouted), "the producers never moved"
        events = [
            e
            for e in cluster.coord_events("pchannel assigned")
            if e["pchannel"] == names[0] and e["old_term"] == victim.term
        ]
        assert events and events[0]["catch_up_from"] == victim.address
        for run in runs:
            check = await verify(wal, run)
            assert run.failed == 0 and check.acknowledged == 1500
            assert check.ok, (run.name, check)


async def test_routed_consumer_resumes_after_a_move_without_gaps_or_duplicates(
    make_cluster,
) -> None:
    cluster = await make_cluster(nodes=2)
    (name,) = await cluster.create_channels(1)
    async with await open_wal(cluster.coord_address) as wal:
        producer = await wal.producer(name, producer_id="writer")
        first = [await producer.send(b"m%d" % i) for i in range(300)]
        consumer = await wal.consumer(name)
        got = []
        async for message in consumer:
            got.append(message)
            if len(got) == 150:
                break
        owner = wal.assignments()[name]
        await cluster.drain(owner.server_id)
        await wait_for(
            lambda: wal.assignments().get(name, owner).term > owner.term, 15, what="the move"
        )
        second = [await producer.send(b"m%d" % i) for i in range(300, 600)]
        await producer.close()

        async def rest() -> None:
            async for message in consumer:
                got.append(message)
                if len(got) == 600:
                    return

        await asyncio.wait_for(rest(), 30)
        await consumer.close()
    assert consumer.reopens >= 1
    assert consumer.route is not None and consumer.route.server_id != owner.server_id
    assert [m.payload for m in got] == [b"m%d" % i for i in range(600)]
    assert [m.offset for m in got] == [r.offset for r in first + second]


async def test_sync_twin_produces_and_reads_through_the_coord(make_cluster) -> None:
    from streamwal.client import connect

    cluster = await make_cluster(nodes=2)
    (name,) = await cluster.create_channels(1)

    def script() -> list[bytes]:
        with connect(cluster.coord_address) as wal:
            producer = wal.new_producer(f"{name}_v1")
            producer.send_many([b"a", b"b"])
            producer.send(b"c")
            producer.close()
            end = wal.end_offset(name)
            return [m.payload for m in wal.consumer(name, end_offset=end, timeout=10)]

    assert await asyncio.to_thread(script) == [b"a", b"b", b"c"]
