"""Moves that keep the log whole: a new owner copies what it lacks from the fenced
previous owner (Assign.catch_up_from), cuts a divergent suffix by term history, and
never reuses offsets when no copy is possible (Assign.min_next_offset)."""

from __future__ import annotations

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.errors import ChannelNotExist, Inner
from streamwal.node.divergence import log_divergence
from tests.node.helpers import read_log


def test_log_divergence_follows_both_term_histories() -> None:
    theirs = [(1, 0), (2, 60), (5, 90)]
    assert log_divergence([(1, 0)], 100, theirs, 120) == 60  # our term-1 tail is not theirs
    assert log_divergence([(1, 0)], 50, theirs, 120) is None  # we stop before they diverge
    assert log_divergence([(1, 0), (2, 60)], 95, theirs, 120) == 90
    assert log_divergence(theirs, 95, theirs, 120) is None  # we are on their newest term
    assert log_divergence([], 0, [], 10) is None
    # a log that started above 0 (an unclean move) agrees where it says nothing
    assert log_divergence([(1, 0)], 100, [(2, 60)], 80) == 60


async def test_move_with_catch_up_continues_the_log_and_dedup(start_node, pchannel) -> None:
    a = start_node("a", node_id=1)
    b = start_node("b", node_id=2)
    async with NodeClient(a.address) as ca, NodeClient(b.address) as cb:
        await ca.assign(pchannel, 1)
        producer = await ca.producer(pchannel, 1, producer_id="app")
        first = await producer.send_many([b"a%d" % i for i in range(3000)])
        await producer.close()
        await ca.remove(pchannel, 1)  # the coord fences the old owner first
        await cb.assign(pchannel, 2, catch_up_from=a.address)
        producer = await cb.producer(pchannel, 2, producer_id="app")
        assert producer.last_sequence == 1  # the producer window moved with the records
        after = await producer.send_many([b"b"])
        await producer.close()
        got = await read_log(cb, pchannel, 2)
    assert [m.payload for m in got] == [b"a%d" % i for i in range(3000)] + [b"b"]
    # the copied record keeps its offsets; an idle TimeTick may sit before the new append
    assert [m.offset for m in got[:-1]] == list(range(first[0].offset, first[0].offset + 3000))
    assert got[-1].offset == after[0].offset > got[-2].offset
    assert {m.term for m in got[:-1]} == {1} and got[-1].term == 2
    ticks = [m.time_tick for m in got]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)


async def test_move_back_cuts_the_unclean_suffix(start_node, pchannel) -> None:
    """A owns term 1 and is lost; B takes term 2 without A's tail (unclean, offsets kept
    above what the coord last saw); A comes back and takes term 3 from B: A's stranded
    term-1 tail is cut and the log is B's."""
    a = start_node("a", node_id=1)
    b = start_node("b", node_id=2)
    async with NodeClient(a.address) as ca, NodeClient(b.address) as cb:
        await ca.assign(pchannel, 1)
        producer = await ca.producer(pchannel, 1)
        seen = await producer.send_many([b"seen%d" % i for i in range(60)])
        stranded = await producer.send_many([b"stranded%d" % i for i in range(40)])
        await producer.close()
        await cb.assign(pchannel, 2, min_next_offset=seen[-1].offset + 1)
        producer = await cb.producer(pchannel, 2)
        newer = await producer.send_many([b"newer%d" % i for i in range(20)])
        await producer.close()
        # offsets are not reused (an idle TimeTick may take the first one on B)
        assert newer[0].offset >= seen[-1].offset + 1 == stranded[0].offset
        await cb.remove(pchannel, 2)
        await ca.assign(pchannel, 3, catch_up_from=b.address)
        got = await read_log(ca, pchannel, 3)
    assert [m.payload for m in got] == [b"seen%d" % i for i in range(60)] + [
        b"newer%d" % i for i in range(20)
    ]
    assert [m.offset for m in got] == [m.offset for m in seen + newer]


async def test_catch_up_from_an_unreachable_node_fails_and_serves_nothing(
    start_node, pchannel
) -> None:
    b = start_node("b", node_id=2)
    async with NodeClient(b.address) as cb:
        with pytest.raises(Inner, match="cannot catch up"):
            await cb.assign(pchannel, 2, catch_up_from="127.0.0.1:1")
        with pytest.raises(ChannelNotExist):
            await cb.producer(pchannel, 2)
        await cb.assign(pchannel, 2)  # without catch-up it may still be assigned


async def test_catch_up_from_a_node_without_the_pchannel_fails(start_node, pchannel) -> None:
    a = start_node("a", node_id=1)
    b = start_node("b", node_id=2)
    async with NodeClient(b.address) as cb:
        with pytest.raises(Inner, match="no log on this node"):
            await cb.assign(pchannel, 2, catch_up_from=a.address)
