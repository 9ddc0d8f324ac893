"""Transactions on a real node process: a committed txn appears whole, contiguous and
with one time tick; rolled-back, expired and node-killed txns never appear; commit and
rollback happen once; the node's limits hold."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import InvalidTransactionState, TransactionExpired
from tests.node.conftest import client, node, pchannel, start_node  # noqa: F401
from tests.node.helpers import read_data


async def _everything(c: NodeClient, pch: str, term: int) -> list:
    """Every data message now in the log (bounded read, TimeTicks left out)."""
    end = next(s for s in (await c.collect_status()).channels if s.pchannel.name == pch)
    consumer = await c.consumer(
        pch, term, DeliverPolicy.all(), time_ticks=False, end_offset=end.next_offset
    )
    got = [m async for m in consumer]
    await consumer.close()
    return got


async def test_committed_txn_is_contiguous_with_one_tick(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    async with await client.producer(pchannel, 1) as producer:
        consumer = await client.consumer(pchannel, 1, time_ticks=False)
        before = await producer.send(b"before", vchannel=vch)
        txn = await producer.begin_txn(vch)
        for i in range(5):
            await txn.append(b"t%d" % i, properties={"k": str(i)})
        # Appends interleaved with the txn land before it: the txn is invisible until commit.
        between = await producer.send(b"between", vchannel=vch)
        result = await txn.commit()
        after = await producer.send(b"after", vchannel=vch)
        got = await read_data(consumer, 8)
        await consumer.close()
    assert [m.payload for m in got] == [
        b"before",
        b"between",
        b"t0",
        b"t1",
        b"t2",
        b"t3",
        b"t4",
        b"after",
    ]
    txn_msgs = got[2:7]
    assert result.count == 5 and result.first_offset == between.offset + 1
    assert (
        result.message_ids
        == [m.offset for m in txn_msgs]
        == list(range(result.first_offset, result.first_offset + 5))
    )
    assert {m.time_tick for m in txn_msgs} == {result.time_tick}
    assert before.time_tick < between.time_tick < result.time_tick < after.time_tick
    assert [m.properties["k"] for m in txn_msgs] == ["0", "1", "2", "3", "4"]
    assert all(m.vchannel == vch for m in txn_msgs)


async def test_rolled_back_and_expired_txns_never_appear(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    async with await client.producer(pchannel, 1) as producer:
        rolled = await producer.begin_txn(vch)
        await rolled.append(b"rolled")
        await rolled.rollback()
        expiring = await producer.begin_txn(vch, keepalive=0.3)
        assert expiring.keepalive == pytest.approx(0.3)
        await expiring.append(b"expired")
        await asyncio.sleep(0.6)
        with pytest.raises(TransactionExpired, match=r"txn \d+ expired"):
            await expiring.commit()
        last = await producer.send(b"last", vchannel=vch)
    got = await _everything(client, pchannel, 1)
    assert [m.payload for m in got] == [b"last"]
    assert got[0].offset == last.offset


async def test_commit_and_rollback_happen_once(client, pchannel) -> None:  # noqa: F811
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    async with await client.producer(pchannel, 1) as producer:
        txn = await producer.begin_txn(vch)
        await txn.append(b"once")
        await txn.commit()
        with pytest.raises(InvalidTransactionState):
            await txn.commit()
        with pytest.raises(InvalidTransactionState):
            await txn.rollback()
        with pytest.raises(InvalidTransactionState):
            await txn.append(b"late")
        rolled = await producer.begin_txn(vch)
        await rolled.rollback()
        with pytest.raises(InvalidTransactionState):
            await rolled.commit()
        # The node enforces it too, whatever the client believes.
        forged = await producer.begin_txn(vch)
        await forged.append(b"x")
        await producer.txn_request(_rollback(forged.txn_id))
        with pytest.raises(InvalidTransactionState, match="rolled back"):
            await forged.commit()
    got = await _everything(client, pchannel, 1)
    assert [m.payload for m in got] == [b"once"]


def _rollback(txn_id: int):
    from streamwal.proto import streaming_pb2 as pb

    return pb.TxnRequest(rollback=pb.TxnRollback(txn_id=txn_id))
