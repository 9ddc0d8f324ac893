"""A QUORUM producer is answered as soon as a majority holds its batch: no send waits
for a timer (the stream's 1 s bound, a follower's 250 ms heartbeat, an idle time tick)
to wake the leader's stream to a follower or the follower's ack.

The nodes' data is in memory (tmpfs): what is tested is that no wake-up is lost, and on
a disk this VM's fsyncs stall for 50-1,000 ms at times (docs/benchmarks.md), which a
send must wait out and would look the same."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamwal.node.channel import Channel
from streamwal.node.channel_meta import ChannelMeta, Tail
from tests.replication.helpers import assign_replicas

SENDS = 300
STALL_S = 0.15  # above any honest loopback round trip in memory, below every timer


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """The trio's data and logs on tmpfs (overrides tests/node/conftest.py's)."""
    path = Path(tempfile.mkdtemp(prefix="quorum-wakeup-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_sequential_quorum_sends_never_wait_for_the_idle_tick(trio, pchannel) -> None:
    nodes, clients = trio
    await assign_replicas(clients, nodes, pchannel, 1, nodes[0])
    producer = await clients[1].producer(pchannel, 1, ack_level="quorum")
    await producer.send(b"warm-up")
    waited = []
    for i in range(SENDS):
        started = time.perf_counter()
        await producer.send(b"m%d" % i)
        waited.append(time.perf_counter() - started)
    await producer.close()
    slow = {i: round(w * 1000) for i, w in enumerate(waited) if w >= STALL_S}
    assert not slow, f"sends waited (send: ms): {slow}"


async def test_a_notify_before_the_waiter_first_runs_is_not_missed() -> None:
    """The leader's stream schedules its wait, then yields; an inline group commit that
    runs first must still wake it."""
    ch = Channel("p", ChannelMeta(), Tail(0, 0, 0, 0))
    waiter = asyncio.ensure_future(ch.wait_changed(1.0))
    ch.notify()  # before the waiter's first step
    started = time.perf_counter()
    await waiter
    assert time.perf_counter() - started < 0.5
