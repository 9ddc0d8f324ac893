"""A QUORUM producer is answered as soon as a majority holds its batch: no send waits
for the idle time tick (200 ms) to wake the leader's stream to a follower."""

from __future__ import annotations

import asyncio
import time

from streamwal.node.channel import Channel
from streamwal.node.channel_meta import ChannelMeta, Tail
from tests.replication.helpers import assign_replicas

SENDS = 300
STALL_S = 0.15  # above any honest loopback round trip, below the 200 ms idle tick


async def test_sequential_quorum_sends_never_wait_for_the_idle_tick(trio, pchannel) -> None:
    nodes, clients = trio
    await assign_replicas(clients, nodes, pchannel, 1, nodes[0])
    producer = await clients[1].producer(pchannel, 1, ack_level="quorum")
    await producer.send(b"warm-up")
    slowest = 0.0
    for i in range(SENDS):
        started = time.perf_counter()
        await producer.send(b"m%d" % i)
        slowest = max(slowest, time.perf_counter() - started)
    await producer.close()
    assert slowest < STALL_S, f"a send waited {slowest * 1000:.0f} ms"


async def test_a_notify_before_the_waiter_first_runs_is_not_missed() -> None:
    """The leader's stream schedules its wait, then yields; an inline group commit that
    runs first must still wake it."""
    ch = Channel("p", ChannelMeta(), Tail(0, 0, 0, 0))
    waiter = asyncio.ensure_future(ch.wait_changed(1.0))
    ch.notify()  # before the waiter's first step
    started = time.perf_counter()
    await waiter
    assert time.perf_counter() - started < 0.5
