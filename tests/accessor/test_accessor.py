"""The WAL accessor against a real coord and nodes: raw_append and its barrier, reads
through a Scanner, per-message results of append_messages, the local MVCC timestamp."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.client.aio import (
    AppendOption,
    DeliverPolicy,
    Message,
    ResourceKey,
    WALLocatedRemote,
    connect,
)
from streamwal.errors import InvalidArgument, ResourceKeyConflict
from streamwal.node.clock import compose, physical_ms
from tests.support import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_raw_append_lands_above_the_barrier(cluster) -> None:
    vchannel = f"{cluster.pchannels[0]}_barrier"
    async with await connect(coord=cluster.coord_address) as wal:
        assert wal.wal_name() == "streamwal"
        first = await wal.raw_append(Message(vchannel, b"before"))
        # A barrier 2 s ahead of the node's clock (e.g. a tick from another pchannel
        # whose node runs ahead): the next tick must still exceed it.
        barrier = compose(physical_ms(first.time_tick) + 2000, 7)
        second = await wal.raw_append(Message(vchannel, b"after"), barrier_time_tick=barrier)
        assert second.time_tick > barrier > first.time_tick
        assert second.message_id == first.message_id + 1
        # The clock stays past the barrier for everyone after it, too.
        third = await wal.raw_append(Message(vchannel, b"later"))
        assert third.time_tick > second.time_tick
        # A barrier far in the future would ruin the pchannel's clock: refused, nothing lost.
        with pytest.raises(InvalidArgument, match="ahead of this node's clock"):
            await wal.raw_append(
                Message(vchannel, b"never"),
                barrier_time_tick=compose(physical_ms(first.time_tick) + 3_600_000),
            )
        fourth = await wal.raw_append(Message(vchannel, b"still fine"))
        assert fourth.message_id == third.message_id + 1
        assert wal.latest_mvcc_timestamp_if_local(vchannel) == fourth.time_tick


async def test_scanner_delivers_one_vchannel_and_reports_done(cluster) -> None:
    pchannel = cluster.pchannels[1]
    mine, other = f"{pchannel}_scan", f"{pchannel}_other"
    async with await connect(coord=cluster.coord_address) as wal:
        with pytest.raises(WALLocatedRemote):
            wal.latest_mvcc_timestamp_if_local(mine)
        results = [await wal.raw_append(Message(v, f"{v}-{i}".encode())) for i in range(5)
                   for v in (mine, other)]  # fmt: skip
        got = []
        scanner = wal.read(mine, DeliverPolicy.all(), handler=got.append)
        await wait_for(lambda: len(got) >= 5, 10, what="5 messages")
        assert [m.payload for m in got] == [f"{mine}-{i}".encode() for i in range(5)]
        assert [m.offset for m in got] == [r.message_id for r in results if r.vchannel == mine]
        assert not scanner.done().is_set() and scanner.error() is None
        await scanner.close()
        assert scanner.done().is_set() and scanner.error() is None

        # A failing handler stops the scanner with its error.
        def boom(_msg) -> None:
            raise RuntimeError("handler failed")

        failing = wal.read(mine, DeliverPolicy.all(), handler=boom)
        await asyncio.wait_for(failing.done().wait(), 10)
        assert isinstance(failing.error(), RuntimeError)


async def test_append_messages_answers_per_message_and_groups_atomically(cluster) -> None:
    a, b = f"{cluster.pchannels[0]}_am", f"{cluster.pchannels[2]}_am"
    async with await connect(coord=cluster.coord_address) as wal:
        msgs = [
            Message(a, b"a0"),
            Message(b, b"b0"),
            Message(a, b"a1"),
            Message(b, b"b1", properties={"_bad": "reserved key"}),  # spoils group b
            Message(a, b"a2"),
        ]
        responses = await wal.append_messages(*msgs)
        assert len(responses) == 5
        ok = [responses[i].result for i in (0, 2, 4)]
        assert all(r is not None and r.vchannel == a for r in ok)
        offsets = [r.message_id for r in ok]
        assert offsets == list(range(offsets[0], offsets[0] + 3)), "group a is one batch"
        for i in (1, 3):  # the whole group failed, each message says why
            assert responses[i].result is None
            assert isinstance(responses[i].error, InvalidArgument)
        with pytest.raises(InvalidArgument):
            responses.unwrap()

        last = await wal.raw_append(Message(a, b"x"))
        barrier = last.time_tick + (5000 << 18)
        with_option = await wal.append_messages_with_option(
            AppendOption(barrier_time_tick=barrier), Message(a, b"y"), Message(b, b"z")
        )
        assert all(r.time_tick > barrier for r in with_option.unwrap())


async def test_broadcast_through_the_accessor_holds_its_key_until_acked(cluster) -> None:
    targets = [f"{cluster.pchannels[0]}_bc", f"{cluster.pchannels[1]}_bc"]
    key = ResourceKey("collection", "accessor-test")
    async with await connect(coord=cluster.coord_address) as wal:
        bc = wal.broadcast()
        result = await bc.append(Message("", b"drop"), targets, [key])
        assert set(result.results) == set(targets)
        for v in targets:  # the acknowledged ticks are the accessor's local view
            assert wal.latest_mvcc_timestamp_if_local(v) >= result.results[v].time_tick
        with pytest.raises(ResourceKeyConflict):
            await bc.append(b"second", targets, [key])
        seen = []
        scanner = wal.read(targets[1], DeliverPolicy.all(), handler=seen.append)
        await wait_for(lambda: seen, 10, what="the broadcast on its vchannel")
        assert seen[0].payload == b"drop" and seen[0].offset == result.results[targets[1]].offset
        await scanner.close()
        for v in targets:
            await bc.ack(result.broadcast_id, v)
        await asyncio.wait_for(bc.block_until_resource_key_ack_all(key), 10)
        again = await bc.append(b"second", targets, [key])
        assert again.broadcast_id != result.broadcast_id
