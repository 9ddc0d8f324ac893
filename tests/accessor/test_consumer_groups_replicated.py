"""Consumer groups and txns on a replicated pchannel: the cursor records and a committed
txn reach the followers like any record, so after the leader is SIGKILLed the promoted
follower continues every group where it stood and holds the txn whole."""

from __future__ import annotations

import pytest

from tests.node.conftest import node_dir, pchannel, start_node  # noqa: F401
from tests.replication.conftest import trio  # noqa: F401
from tests.replication.helpers import assign_replicas
from tests.replication.test_node_replication_failover import _fail_over


@pytest.mark.slow
async def test_groups_and_txns_survive_a_leader_kill(trio, pchannel) -> None:  # noqa: F811
    nodes, clients = trio
    leader = nodes[0]
    await assign_replicas(clients, nodes, pchannel, 1, leader)
    c = clients[leader.node_id]
    vch = f"{pchannel}_v0"
    async with await c.producer(pchannel, 1, ack_level="quorum") as producer:
        offsets = [r.offset for r in await producer.send_many([b"m%d" % i for i in range(10)])]
        txn = await producer.begin_txn(vch)
        for i in range(3):
            await txn.append(b"t%d" % i)
        committed = await txn.commit()  # answered once a quorum has it
        open_txn = await producer.begin_txn(vch)
        await open_txn.append(b"never")
    await c.create_consumer_group(pchannel, 1, "g")
    assert [m.offset for m in await c.group_consume(pchannel, 1, "g", 4)] == offsets[:4]
    leader.kill()

    new, _ = await _fail_over(clients, nodes, nodes[1:], pchannel, 2)
    nc = clients[new.node_id]
    rest = await nc.group_consume(pchannel, 2, "g", 100)
    assert [m.offset for m in rest] == offsets[4:] + committed.message_ids
    assert [m.payload for m in rest[6:]] == [b"t0", b"t1", b"t2"]
    assert {m.time_tick for m in rest[6:]} == {committed.time_tick}
    assert await nc.group_consume(pchannel, 2, "g", 100) == []
