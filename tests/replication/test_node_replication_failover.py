"""Failover by hand, as the coord does it: fence the survivors at a higher term, make the
one with the highest (last term, log end) the leader, the others follow it; an old
leader comes back as a follower and cuts what it alone held."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import ChannelFenced
from streamwal.node import records
from streamwal.node.replication import WINDOW_BYTES
from streamwal.testing.local_node import LocalNode
from tests.node.helpers import expect_nothing, read_data
from tests.replication.helpers import (
    assign_replicas,
    fail_or_timeout,
    raw_log,
    status,
    wait_identical,
)
from tests.support import wait_for


def _rank(f) -> tuple[int, int]:
    return f.last_term, f.next_offset


async def _fail_over(clients, nodes, survivors: list[LocalNode], pch: str, term: int):
    """Fence the survivors at `term`, pick the new leader, assign everyone reachable."""
    fenced = {n.node_id: await clients[n.node_id].fence(pch, term) for n in survivors}
    best = max(survivors, key=lambda n: _rank(fenced[n.node_id]))
    await assign_replicas(
        {n.node_id: clients[n.node_id] for n in survivors}, nodes, pch, term, best
    )
    return best, fenced


async def test_kill_leader_new_leader_keeps_every_acknowledged_message(
    trio, pchannel, start_node
) -> None:
    nodes, clients = trio
    old = nodes[0]
    await assign_replicas(clients, nodes, pchannel, 1, old)
    producer = await clients[1].producer(pchannel, 1, producer_id="app", ack_level="quorum")
    acked = []
    for i in range(30):
        acked += await producer.send_many([b"q%d-%d" % (i, j) for j in range(20)])

    async def both_followers_have_them() -> bool:  # a quorum needs one; the test, both
        s = await status(clients[1], pchannel)
        return s is not None and all(p.acked_offset > acked[-1].offset for p in s.replicas)

    await wait_for(both_followers_have_them, 30, 0.05, "both followers caught up")
    # both followers stop; the old leader alone takes LEADER-level appends. The followers
    # get at most a window of them (WINDOW_BYTES, buffered in sockets): the rest is
    # stranded on the old leader, never committed.
    nodes[1].pause()
    nodes[2].pause()
    lonely = await clients[1].producer(pchannel, 1, ack_level="leader")
    stranded = []
    for _ in range(4 * WINDOW_BYTES // (50 * 8192)):
        stranded += await lonely.send_many([b"stranded".ljust(8192)] * 50)
    old.kill()
    nodes[1].resume()
    nodes[2].resume()

    new, fenced = await _fail_over(clients, nodes, nodes[1:], pchannel, 2)
    assert all(f.last_term == 1 for f in fenced.values())
    assert max(f.next_offset for f in fenced.values()) > acked[-1].offset  # a quorum has it
    # the producer re-routed to the new leader resends its last batch: deduplicated
    client = clients[new.node_id]
    moved = await client.producer(pchannel, 2, producer_id="app", ack_level="quorum")
    assert moved.last_sequence == 30
    after = await moved.send_many([b"after"] * 10)
    await moved.close()
    consumer = await client.consumer(pchannel, 2, DeliverPolicy.all(), time_ticks=False)
    got = await read_data(consumer, len(acked) + 10)
    await consumer.close()
    by_offset = {m.offset: m.payload for m in got}
    assert len(by_offset) == len(got)  # exactly once
    for i, r in enumerate(acked):
        assert by_offset[r.offset] == b"q%d-%d" % (i // 20, i % 20)
    kept = [o for o, p in by_offset.items() if p.startswith(b"stranded")]
    assert kept == list(range(stranded[0].offset, stranded[0].offset + len(kept)))
    assert len(kept) < len(stranded)  # offsets continue above what the followers got
    assert after[0].offset < stranded[-1].offset

    # the old leader restarts and follows at term 2: it cuts its stranded suffix
    restarted = LocalNode(old.data_dir, node_id=old.node_id).start(timeout=60)
    try:
        async with NodeClient(restarted.address) as c1:
            await c1.wait_ready(30)
            clients[1] = c1
            nodes[0] = restarted
            before = await raw_log(restarted.address, pchannel)
            assert before[-1][0] >= stranded[-1].offset - 49  # its stranded tail survived
            await assign_replicas({1: c1}, nodes, pchannel, 2, new)
            await wait_identical([n.address for n in nodes], pchannel)
            after_cut = await raw_log(restarted.address, pchannel)
            assert after_cut[: len(after_cut) - 1] != before[: len(after_cut) - 1]  # cut
            assert {records.peek(v)[0] for _, v in after_cut} == {1, 2}
    finally:
        restarted.kill()


async def test_paused_old_leader_acknowledges_and_exposes_nothing(trio, pchannel) -> None:
    nodes, clients = trio
    old = nodes[0]
    await assign_replicas(clients, nodes, pchannel, 1, old)
    quorum = await clients[1].producer(pchannel, 1, ack_level="quorum")
    await quorum.send_many([b"before"] * 10)
    consumer = await clients[1].consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    await read_data(consumer, 10)
    committed = (await status(clients[1], pchannel)).commit_offset

    old.pause()
    new, _ = await _fail_over(clients, nodes, nodes[1:], pchannel, 2)
    moved = await clients[new.node_id].producer(pchannel, 2, ack_level="quorum")
    await moved.send_many([b"new-term"] * 10)
    old.resume()

    # the old leader still believes in term 1, but nobody acknowledges it any more
    late = asyncio.ensure_future(quorum.send(b"late"))
    assert await fail_or_timeout(asyncio.shield(late), 2.0) == "timeout"
    await expect_nothing(consumer, 1.0)
    assert (await status(clients[1], pchannel)).commit_offset == committed

    # told about term 2 (as a follower), it fails the waiting producer and joins
    await assign_replicas({1: clients[1]}, nodes, pchannel, 2, new)
    with pytest.raises(ChannelFenced):
        await asyncio.wait_for(late, 10)
    log = await wait_identical([n.address for n in nodes], pchannel)
    assert all(b"late" not in value for _, value in log)
