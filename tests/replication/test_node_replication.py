"""Replication between real node processes, assigned by hand as the coord would: the
leader streams its records to the followers, QUORUM producers are answered once a
majority stores their batch, consumers only see committed offsets."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.node_client import NodeClient, replica_set
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import ChannelFenced, InvalidArgument
from streamwal.proto import streaming_pb2 as pb
from tests.node.helpers import expect_nothing, read_data
from tests.replication.helpers import (
    assign_replicas,
    fail_or_timeout,
    follower_transports,
    members,
    raw_log,
    status,
    wait_identical,
)


async def test_quorum_producer_logs_are_identical_on_all_replicas(trio, pchannel) -> None:
    nodes, clients = trio
    leader = nodes[0]
    await assign_replicas(clients, nodes, pchannel, 1, leader)
    producer = await clients[1].producer(pchannel, 1, ack_level="quorum")
    sent = []
    for i in range(20):
        sent += await producer.send_many([b"m%d-%d" % (i, j) for j in range(50)])
    await producer.close()
    # acknowledged at QUORUM: at least one follower already holds the last batch
    ends = [(await status(clients[n.node_id], pchannel)).next_offset for n in nodes[1:]]
    assert max(ends) > sent[-1].offset
    log = await wait_identical([n.address for n in nodes], pchannel)
    assert log[0][0] == 0 and sum(1 for _ in log) >= 20
    leader_status = await status(clients[1], pchannel)
    assert leader_status.role == pb.REPLICA_ROLE_LEADER
    assert leader_status.commit_offset > sent[-1].offset
    assert {r.node_id for r in leader_status.replicas} == {2, 3}
    # the followers took the leader's replication port (Describe names it)
    assert (await clients[1].describe()).replication_port > 0
    assert follower_transports(leader, pchannel) == {2: "port", 3: "port"}
    follower_status = await status(clients[2], pchannel)
    assert follower_status.role == pb.REPLICA_ROLE_FOLLOWER
    assert follower_status.last_term == 1
    # followers serve no client: the error names the leader
    with pytest.raises(ChannelFenced, match=leader.address):
        await clients[2].producer(pchannel, 1)
    with pytest.raises(ChannelFenced, match=leader.address):
        await clients[3].consumer(pchannel, 1)
    consumer = await clients[1].consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    got = await read_data(consumer, len(sent))
    await consumer.close()
    assert [(m.offset, m.payload) for m in got] == [
        (r.offset, b"m%d-%d" % (i // 50, i % 50)) for i, r in enumerate(sent)
    ]


async def test_replicate_and_assign_reject_what_does_not_fit(trio, pchannel) -> None:
    nodes, clients = trio
    ms = members(nodes)
    with pytest.raises(InvalidArgument, match="does not include this node"):
        await clients[1].assign(pchannel, 1, replica_set=replica_set(True, ms[1:]))
    with pytest.raises(InvalidArgument, match="leader"):
        await clients[2].assign(pchannel, 1, replica_set=replica_set(False, ms))
    await clients[1].assign(pchannel, 2, replica_set=replica_set(True, ms))
    # a follower of another term is refused by the leader; it keeps retrying, unserved
    rs = replica_set(False, ms, (1, nodes[0].address))
    await clients[2].assign(pchannel, 1, replica_set=rs)
    await asyncio.sleep(1.0)
    leader = await status(clients[1], pchannel)
    assert {r.node_id: r.acked_offset for r in leader.replicas}[2] == 0
    # a lower fence changes nothing; a higher one stops the leader
    resp = await clients[1].fence(pchannel, 1)
    assert resp.next_offset >= 1  # the new leader's first time tick
    producer = await clients[1].producer(pchannel, 2, ack_level="leader")
    await producer.send(b"x")
    resp = await clients[1].fence(pchannel, 3)
    last_base = (await raw_log(nodes[0].address, pchannel))[-1][0]
    assert (resp.last_term, resp.next_offset) == (2, last_base + 1)
    for term in (2, 3):
        with pytest.raises(ChannelFenced, match="fenced at term 3"):
            await clients[1].producer(pchannel, term)
    # Fence on a node that never had the pchannel: an empty log, and the term holds
    resp = await clients[3].fence("never-here", 4)
    assert (resp.last_term, resp.next_offset, resp.commit_offset) == (0, 0, 0)
    with pytest.raises(Exception, match="IGNORED_OPERATION"):
        await clients[3].assign("never-here", 3)
    await clients[3].assign("never-here", 4)
    producer = await clients[3].producer("never-here", 4)
    r = await producer.send(b"y")
    # The log starts empty at the fenced end (0); an idle time tick may take offset 0
    # before the send does, so the message is the log's last record, at 0 or just after.
    here = await status(clients[3], "never-here")
    assert r.offset <= 1 and here.next_offset >= r.offset + 1
    await producer.close()


async def test_quorum_needs_a_majority_and_hides_the_rest(trio, pchannel) -> None:
    nodes, clients = trio
    leader, f2, f3 = nodes
    await assign_replicas(clients, nodes, pchannel, 1, leader)
    quorum = await clients[1].producer(pchannel, 1, ack_level="quorum")
    await quorum.send_many([b"warm"] * 10)
    consumer = await clients[1].consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
    await read_data(consumer, 10)

    f3.pause()  # one follower down: 2 of 3 still acknowledge
    for i in range(10):
        await asyncio.wait_for(quorum.send_many([b"two-of-three-%d" % i] * 10), 10)
    assert len(await read_data(consumer, 100)) == 100
    f3.resume()
    await wait_identical([n.address for n in nodes], pchannel)

    f2.pause()
    f3.pause()  # no majority: a QUORUM producer waits, consumers see nothing new
    pending = asyncio.ensure_future(quorum.send(b"uncommitted"))
    leader_only = await clients[1].producer(pchannel, 1, ack_level="leader")
    acked = await asyncio.wait_for(leader_only.send(b"leader-level"), 10)
    assert await fail_or_timeout(asyncio.shield(pending), 2.0) == "timeout"
    commit = (await status(clients[1], pchannel)).commit_offset
    assert commit < acked.offset
    tail = DeliverPolicy.start_from(commit)
    hidden = await clients[1].consumer(pchannel, 1, tail, time_ticks=False)
    assert hidden.next_offset == commit  # the log end consumers are shown
    await expect_nothing(hidden, 1.0)  # (cancels its stream)
    f2.resume()
    f3.resume()
    first = await asyncio.wait_for(pending, 15)
    assert first.offset < acked.offset
    got = await read_data(consumer, 2)
    assert [m.payload for m in got] == [b"uncommitted", b"leader-level"]
    await consumer.close()
    await quorum.close()
    await leader_only.close()
    await wait_identical([n.address for n in nodes], pchannel)


async def test_followers_use_grpc_when_the_leader_offers_no_replication_port(
    start_node, pchannel
) -> None:
    """--replication-listen off (as with TLS, where the port stays closed): Describe names
    no port, the followers replicate over gRPC Replicate, and quorum appends work."""
    nodes = [
        start_node("n1", "--replication-listen", "off", node_id=1),
        start_node("n2", node_id=2),
    ]
    clients = {n.node_id: NodeClient(n.address) for n in nodes}
    try:
        assert (await clients[1].describe()).replication_port == 0
        await assign_replicas(clients, nodes, pchannel, 1, nodes[0])
        producer = await clients[1].producer(pchannel, 1, ack_level="quorum")
        sent = await producer.send_many([b"m%d" % i for i in range(10)])
        await producer.close()
        follower = await status(clients[2], pchannel)
        assert follower is not None and follower.next_offset > sent[-1].offset
        assert follower_transports(nodes[0], pchannel) == {2: "grpc"}
    finally:
        for c in clients.values():
            await c.close()
