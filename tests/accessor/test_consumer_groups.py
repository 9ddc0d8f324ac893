"""RocksMQ-style consumer groups on real node processes: cursors kept by the node, shared
by concurrent consumers without duplicates, surviving kill -9 and moving with the
pchannel; ordinary consumers never see the cursor records."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.client.sync import SyncNodeClient
from streamwal.errors import (
    ConsumerGroupExist,
    ConsumerGroupNotExist,
    InvalidArgument,
    UnmatchedChannelTerm,
)
from tests.node.conftest import client, node, node_dir, pchannel, start_node  # noqa: F401
from tests.node.helpers import read_data


async def _fill(c: NodeClient, pch: str, term: int, payloads: list[bytes]) -> list[int]:
    async with await c.producer(pch, term) as producer:
        return [r.offset for r in await producer.send_many(payloads)]


async def _drain(c: NodeClient, pch: str, term: int, group: str, n: int) -> list:
    """group_consume until it comes back empty."""
    out = []
    while batch := await c.group_consume(pch, term, group, n):
        out += batch
    return out


async def test_group_consume_seek_and_errors(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    offsets = await _fill(client, pchannel, 1, [b"m%d" % i for i in range(10)])
    assert await client.create_consumer_group(pchannel, 1, "g") == 0
    with pytest.raises(ConsumerGroupExist, match="'g' already exists"):
        await client.create_consumer_group(pchannel, 1, "g")
    first = await client.group_consume(pchannel, 1, "g", 4)
    assert [m.payload for m in first] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.offset for m in first] == offsets[:4]
    rest = await client.group_consume(pchannel, 1, "g", 100)
    assert [m.payload for m in rest] == [b"m%d" % i for i in range(4, 10)]
    assert await client.group_consume(pchannel, 1, "g", 100) == []
    # A second group has its own cursor.
    await client.create_consumer_group(pchannel, 1, "other")
    assert len(await client.group_consume(pchannel, 1, "other", 3)) == 3
    await client.group_seek(pchannel, 1, "g", offsets[7])
    again = await client.group_consume(pchannel, 1, "g", 100)
    assert [m.offset for m in again] == offsets[7:]
    # Time ticks carry on underneath; new data shows up for the group.
    more = await _fill(client, pchannel, 1, [b"new"])
    assert [m.offset for m in await client.group_consume(pchannel, 1, "g", 5)] == more
    with pytest.raises(ConsumerGroupNotExist):
        await client.group_consume(pchannel, 1, "nope", 1)
    with pytest.raises(UnmatchedChannelTerm):
        await client.group_consume(pchannel, 2, "g", 1)
    with pytest.raises(InvalidArgument):
        await client.group_consume(pchannel, 1, "g", 0)
    with pytest.raises(InvalidArgument, match="past the end"):
        await client.group_seek(pchannel, 1, "g", 10**9)
    await client.destroy_consumer_group(pchannel, 1, "g")
    with pytest.raises(ConsumerGroupNotExist):
        await client.group_consume(pchannel, 1, "g", 1)
    with pytest.raises(ConsumerGroupNotExist):
        await client.destroy_consumer_group(pchannel, 1, "g")


async def test_ordinary_consumers_never_see_cursor_records(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    await client.create_consumer_group(pchannel, 1, "g")
    consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    for i in range(3):
        await _fill(client, pchannel, 1, [b"d%d" % i])
        assert len(await client.group_consume(pchannel, 1, "g", 10)) == 1
    got = await read_data(consumer, 3)
    await consumer.close()
    assert [m.payload for m in got] == [b"d0", b"d1", b"d2"]
    offsets = [m.offset for m in got]
    assert offsets == sorted(offsets)  # monotonic; the cursor records between take offsets


async def test_two_concurrent_consumers_share_a_group_exactly_once(client, pchannel) -> None:  # noqa: F811
    """Two consumers pull from one group while a producer appends: every message reaches
    exactly one of them."""
    await client.assign(pchannel, 1)
    await client.create_consumer_group(pchannel, 1, "shared")
    total = 3000
    produced: list[int] = []
    received = [0]

    async def produce() -> None:
        async with await client.producer(pchannel, 1) as producer:
            for start in range(0, total, 100):
                batch = await producer.send_many([b"%d" % i for i in range(start, start + 100)])
                produced.extend(r.offset for r in batch)

    async def consume(n: int) -> list:
        got: list = []
        async with NodeClient(client.address) as own:  # its own connection, as a process
            while received[0] < total:
                batch = await own.group_consume(pchannel, 1, "shared", n)
                got += batch
                received[0] += len(batch)
                if not batch:
                    await asyncio.sleep(0.005)
        return got

    one, two, _ = await asyncio.wait_for(asyncio.gather(consume(7), consume(50), produce()), 60)
    offsets_one = [m.offset for m in one]
    offsets_two = [m.offset for m in two]
    assert one and two, "both consumers got messages"
    assert not set(offsets_one) & set(offsets_two)
    assert sorted(offsets_one + offsets_two) == produced
    assert offsets_one == sorted(offsets_one) and offsets_two == sorted(offsets_two)
    assert await client.group_consume(pchannel, 1, "shared", 10) == []


@pytest.mark.slow
async def test_cursors_survive_kill_9_and_move_with_the_pchannel(start_node, pchannel) -> None:  # noqa: F811
    """Cursors come back after kill -9 + restart, then follow the pchannel to another node
    that catches up from this one (the cursor records are part of the copied log)."""
    a = start_node("a", node_id=1)
    async with NodeClient(a.address) as ca:
        await ca.wait_ready(30)
        await ca.assign(pchannel, 1)
        offsets = await _fill(ca, pchannel, 1, [b"m%d" % i for i in range(20)])
        await ca.create_consumer_group(pchannel, 1, "g1")
        await ca.create_consumer_group(pchannel, 1, "g2")
        assert len(await ca.group_consume(pchannel, 1, "g1", 5)) == 5
        assert len(await ca.group_consume(pchannel, 1, "g2", 12)) == 12
    a.kill()
    a = start_node("a", node_id=1)
    async with NodeClient(a.address) as ca:
        await ca.wait_ready(30)
        await ca.assign(pchannel, 1)
        got = await ca.group_consume(pchannel, 1, "g1", 3)
        assert [m.offset for m in got] == offsets[5:8]
        await ca.remove(pchannel, 1)  # the coord fences the old owner before the move
    b = start_node("b", node_id=2)
    async with NodeClient(b.address) as cb:
        await cb.wait_ready(30)
        await cb.assign(pchannel, 2, catch_up_from=a.address)
        g1 = await cb.group_consume(pchannel, 2, "g1", 100)
        g2 = await cb.group_consume(pchannel, 2, "g2", 100)
        assert [m.offset for m in g1] == offsets[8:]
        assert [m.offset for m in g2] == offsets[12:]
        assert {m.term for m in g1} == {1}
        with pytest.raises(ConsumerGroupExist):
            await cb.create_consumer_group(pchannel, 2, "g1")
    b.kill()
    b = start_node("b", node_id=2)  # and the moved cursors survive a restart there too
    async with NodeClient(b.address) as cb:
        await cb.wait_ready(30)
        await cb.assign(pchannel, 2)
        assert await cb.group_consume(pchannel, 2, "g1", 100) == []
        await cb.group_seek(pchannel, 2, "g2", offsets[0])
        assert len(await cb.group_consume(pchannel, 2, "g2", 100)) == 20


async def test_groups_deliver_a_txn_whole(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    async with await client.producer(pchannel, 1) as producer:
        head = await producer.send(b"head", vchannel=vch)
        txn = await producer.begin_txn(vch)
        for i in range(5):
            await txn.append(b"t%d" % i)
        result = await txn.commit()
        await producer.send(b"tail", vchannel=vch)
    await client.create_consumer_group(pchannel, 1, "g")
    # Room for 3: the head, and the txn waits rather than being split.
    assert [m.payload for m in await client.group_consume(pchannel, 1, "g", 3)] == [b"head"]
    # First in line, the txn comes whole even past n.
    whole = await client.group_consume(pchannel, 1, "g", 2)
    assert [m.offset for m in whole] == result.message_ids
    assert {m.time_tick for m in whole} == {result.time_tick}
    assert [m.payload for m in await client.group_consume(pchannel, 1, "g", 9)] == [b"tail"]
    with pytest.raises(InvalidArgument, match="inside a transaction"):
        await client.group_seek(pchannel, 1, "g", result.message_ids[2])
    await client.group_seek(pchannel, 1, "g", head.offset)
    assert len(await client.group_consume(pchannel, 1, "g", 100)) == 7


async def test_a_retried_claim_gets_the_same_messages_again(start_node, pchannel) -> None:  # noqa: F811
    """A consume whose answer was lost is retried with the same claim and gets the same
    messages, even from a restarted owner; a new claim moves on."""
    owner = start_node("a")
    async with NodeClient(owner.address) as c:
        await c.assign(pchannel, 1)
        await _fill(c, pchannel, 1, [b"m%d" % i for i in range(6)])
        await c.create_consumer_group(pchannel, 1, "g")
        first = await c.group_consume(pchannel, 1, "g", 4, consumer_id="me", claim=1)
        assert [m.payload for m in first] == [b"m0", b"m1", b"m2", b"m3"]
        # Another consumer of the group moves on meanwhile; my retry is not disturbed.
        other = await c.group_consume(pchannel, 1, "g", 1, consumer_id="you", claim=1)
        assert [m.payload for m in other] == [b"m4"]
        again = await c.group_consume(pchannel, 1, "g", 4, consumer_id="me", claim=1)
        assert [(m.offset, m.payload) for m in again] == [(m.offset, m.payload) for m in first]
    owner.kill()
    owner = start_node("a")
    async with NodeClient(owner.address) as c:
        await c.assign(pchannel, 2)
        again = await c.group_consume(pchannel, 2, "g", 4, consumer_id="me", claim=1)
        assert [m.payload for m in again] == [b"m0", b"m1", b"m2", b"m3"]
        nxt = await c.group_consume(pchannel, 2, "g", 4, consumer_id="me", claim=2)
        assert [m.payload for m in nxt] == [b"m5"]
        with pytest.raises(InvalidArgument, match="consumer_id"):
            await c.group_consume(pchannel, 2, "g", 1, consumer_id="x" * 201, claim=1)


async def test_cursors_outlive_retention_for_a_later_catch_up(start_node, pchannel) -> None:  # noqa: F811
    """Retention cuts the records holding the cursors; the node appends them again before
    the cut, so a node catching up from the retained log at any moment has the groups.
    (Idle time ticks also extend the log, so the cut is no sign the copy was made.)"""
    check = ("--retention-check-interval", "100ms")
    a = start_node("a", *check, node_id=1)
    b = start_node("b", *check, node_id=2)
    async with NodeClient(a.address) as ca, NodeClient(b.address) as cb:
        await ca.assign(pchannel, 1, retention_age_ms=1000)  # "fresh" outlives the test
        await _fill(ca, pchannel, 1, [b"old%d" % i for i in range(5)])
        await ca.create_consumer_group(pchannel, 1, "g")
        assert len(await ca.group_consume(pchannel, 1, "g", 2)) == 2
        cursors_at = (await _status(ca, pchannel)).next_offset - 1
        await asyncio.sleep(1.1)
        await _fill(ca, pchannel, 1, [b"fresh"])
        for _ in range(100):  # retention passes every 100 ms
            status = await _status(ca, pchannel)
            if status.first_offset > cursors_at:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"retention never cut past the cursors: {status}")
        await ca.remove(pchannel, 1)
        await cb.assign(pchannel, 2, catch_up_from=a.address)
        got = await cb.group_consume(pchannel, 2, "g", 10)
        assert [m.payload for m in got] == [b"fresh"]


async def _status(c: NodeClient, pch: str):
    return next(s for s in (await c.collect_status()).channels if s.pchannel.name == pch)


def test_sync_twin_txn_and_groups(node, pchannel) -> None:  # noqa: F811
    """The blocking client offers the same txn and group calls."""
    with SyncNodeClient(node.address) as c:
        c.assign(pchannel, 1)
        with c.producer(pchannel, 1) as producer:
            txn = producer.begin_txn(f"{pchannel}_v0", keepalive=5)
            txn.append(b"a")
            txn.append(b"b", properties={"k": "v"})
            result = txn.commit()
        c.create_consumer_group(pchannel, 1, "g")
        got = c.group_consume(pchannel, 1, "g", 10)
        assert [m.offset for m in got] == result.message_ids
        assert [m.time_tick for m in got] == [result.time_tick] * 2
        c.group_seek(pchannel, 1, "g", result.message_ids[0])
        assert len(c.group_consume(pchannel, 1, "g", 10)) == 2
        c.destroy_consumer_group(pchannel, 1, "g")
        with pytest.raises(ConsumerGroupNotExist):
            c.group_consume(pchannel, 1, "g", 1)


async def test_an_idle_member_polling_appends_nothing(client, pchannel) -> None:  # noqa: F811
    """Polls that find only time ticks (and the group's own cursor records) write nothing:
    each used to append a cursor record, which the next poll passed over in turn."""
    await client.assign(pchannel, 1)
    await _fill(client, pchannel, 1, [b"m"])
    await client.create_consumer_group(pchannel, 1, "idle")
    assert len(await client.group_consume(pchannel, 1, "idle", 10)) == 1

    async def end() -> int:
        status = await client.collect_status()
        return next(c.next_offset for c in status.channels if c.pchannel.name == pchannel)

    before = await end()
    for _ in range(20):
        assert await client.group_consume(pchannel, 1, "idle", 10) == []
    grown = await end() - before
    # Time ticks still go on (about 5 a second by default); 20 polls wrote no cursor.
    assert grown <= 3, f"the log grew by {grown} records over 20 empty polls"
