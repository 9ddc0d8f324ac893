"""Transactions on a real node process: a committed txn appears whole, contiguous and
with one time tick; rolled-back, expired and node-killed txns never appear; commit and
rollback happen once; the node's limits hold."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.errors import (
    InvalidArgument,
    InvalidTransactionState,
    ResourceExhausted,
    TransactionExpired,
)
from streamwal.ids import decode_offset
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import free_port
from streamwal.transport import make_channel
from tests.node.conftest import client, node, node_dir, pchannel, start_node  # noqa: F401
from tests.node.helpers import HANDLER, read_data, read_log, sample, scrape


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
    got = await read_log(client, pchannel, 1)
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
    got = await read_log(client, pchannel, 1)
    assert [m.payload for m in got] == [b"once"]


def _rollback(txn_id: int) -> pb.TxnRequest:
    return pb.TxnRequest(rollback=pb.TxnRollback(txn_id=txn_id))


@pytest.mark.slow
async def test_txn_interrupted_by_kill_9_never_appears(start_node, pchannel) -> None:  # noqa: F811
    """kill -9 with one txn committed (acknowledged) and one open: after the restart and
    the re-assignment the committed one is whole and nothing of the open one exists."""
    node = start_node("n1")  # noqa: F811
    vch = f"{pchannel}_v0"
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        done = await producer.begin_txn(vch)
        for i in range(3):
            await done.append(b"kept%d" % i)
        committed = await done.commit()
        interrupted = await producer.begin_txn(vch)
        for i in range(100):
            await interrupted.append(b"lost%d" % i)
        node.kill()
        with pytest.raises(InvalidTransactionState, match="lost"):
            await asyncio.wait_for(_commit_when_broken(producer, interrupted), 10)
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        got = await read_log(c, pchannel, 1)
        assert [m.payload for m in got] == [b"kept0", b"kept1", b"kept2"]
        assert [m.offset for m in got] == committed.message_ids
        assert {m.time_tick for m in got} == {committed.time_tick}
        # A new txn on the restarted node works, and lands after the survivor.
        async with await c.producer(pchannel, 1) as producer:
            txn = await producer.begin_txn(vch)
            await txn.append(b"after")
            result = await txn.commit()
        assert result.first_offset > committed.message_ids[-1]
        assert result.time_tick > committed.time_tick


async def _commit_when_broken(producer, txn) -> None:
    """Commit once the client has noticed the broken stream (kill -9 is asynchronous)."""
    await producer.broken.wait()
    await txn.commit()


async def test_txn_limits(start_node, pchannel) -> None:  # noqa: F811
    port = free_port()
    node = start_node(  # noqa: F811
        "n1", "--txn-max-bytes", "1KiB", "--txn-max-open", "2", "--metrics", f"127.0.0.1:{port}"
    )
    vch = f"{pchannel}_v0"
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        async with await c.producer(pchannel, 1) as producer:
            big = await producer.begin_txn(vch)
            await big.append(b"a" * 600)
            with pytest.raises(InvalidArgument, match="over the per-txn limit of 1024"):
                await big.append(b"b" * 600)
            await big.append(b"c" * 100)  # the refused append left the txn usable
            second = await producer.begin_txn(vch)
            with pytest.raises(ResourceExhausted, match="--txn-max-open"):
                await producer.begin_txn(vch)
            await second.rollback()
            third = await producer.begin_txn(vch)  # a slot came free
            await third.rollback()
            result = await big.commit()
            with pytest.raises(InvalidArgument, match="not on pchannel"):
                await producer.begin_txn("elsewhere_v0")
        got = await read_log(c, pchannel, 1)
    assert [m.payload for m in got] == [b"a" * 600, b"c" * 100]
    assert result.count == 2
    samples = scrape(port)
    assert sample(samples, "streamwal_txns_total", outcome="committed") == 1
    assert sample(samples, "streamwal_txns_total", outcome="rolled_back") == 2
    assert sample(samples, "streamwal_txn_open") == 0


async def test_resent_commit_is_answered_not_appended_again(client, pchannel) -> None:  # noqa: F811
    """A commit whose answer was lost is resent by a new producer stream with the same
    producer id and sequence (what the routing layer does): the node answers it with the
    original result and appends nothing."""
    await client.assign(pchannel, 1)
    vch = f"{pchannel}_v0"
    async with await client.producer(pchannel, 1, producer_id="app") as producer:
        txn = await producer.begin_txn(vch)
        await txn.append(b"once")
        first = await txn.commit()  # the producer's first sequence: only commits take one
    resent = await _raw_commit(client.address, pchannel, "app", txn.txn_id, sequence=1)
    assert resent.committed.duplicate
    assert decode_offset(resent.committed.first_id.id) == first.first_offset
    assert resent.committed.time_tick == first.time_tick
    unknown = await _raw_commit(client.address, pchannel, "app", txn.txn_id, sequence=2)
    # A new sequence is a new commit: refused, the txn is closed.
    assert unknown.error.code == pb.STREAMING_CODE_INVALID_TRANSACTION_STATE
    assert "committed" in unknown.error.cause
    got = await read_log(client, pchannel, 1)
    assert [m.payload for m in got] == [b"once"]
    assert got[0].offset == first.first_offset


async def _raw_commit(
    address: str, pch: str, producer_id: str, txn_id: int, sequence: int
) -> pb.TxnResponse:
    """A commit frame on a fresh Produce stream, as a resending client writes it."""
    channel = make_channel(address)
    header = pb.CreateProducerRequest(
        pchannel=pb.PChannelInfo(name=pch, term=1), producer_id=producer_id
    )
    call = channel.stream_stream(
        HANDLER + "Produce",
        request_serializer=pb.ProduceRequest.SerializeToString,
        response_deserializer=pb.ProduceResponse.FromString,
    )(metadata=(("create-producer-bin", header.SerializeToString()),))
    try:
        assert (await call.read()).WhichOneof("response") == "create"
        commit = pb.TxnCommit(txn_id=txn_id, sequence=sequence)
        await call.write(pb.ProduceRequest(txn=pb.TxnRequest(request_id=1, commit=commit)))
        resp = await asyncio.wait_for(call.read(), 10)
        return resp.txn
    finally:
        call.cancel()
        await channel.close()
