"""A follower whose disk stalls is slow, not gone: its leader keeps the quorum lease.

The quorum lease (node/health.py) makes a leader that hears from no majority of its
replicas within `--quorum-lease` report itself unhealthy, and the coord moves the
leadership away. It is about reachability: a follower whose fsyncs stall for longer than
the lease (this VM's disk stalls for 50-1,000 ms at times) is still there, and moving
the leadership cannot make its disk faster. With the other follower gone (its node
restarting, as in a rolling upgrade) the stalled follower is the whole majority: the
leader must keep its term, the producer's sends wait out the stall, and nothing
acknowledged is lost.

Every node's data dir is a lazyfs mount (`lazyfs.py`), so that one follower's fsyncs
can be stalled (`stall_syncs`) while its process runs on.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from streamwal.client.wal import WAL, open_wal
from tests.nemesis.history import Producers
from tests.nemesis.scenarios import GRACE, PROBE

LEASE_S = 1.0  # the node's default --quorum-lease
STALL_S = 3 * LEASE_S


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_follower_whose_disk_stalls_keeps_its_leader_in_office(nemesis) -> None:
    mounts = {i: nemesis.lazy_mount(nemesis.root / f"node{i}") for i in (1, 2, 3)}
    cluster = nemesis.cluster(3, grace=GRACE, probe_interval=PROBE)
    await cluster.start()
    [name] = await cluster.create_channels(1, prefix="slow", replicas=3)
    wal: WAL | None = None
    try:
        wal = await open_wal(cluster.coord_address, failover_timeout=20)
        await wal.resolve(name, timeout=30)
        await cluster.wait_healthy([name])
        leader, term = await cluster.leader(name), await cluster.term(name)
        slow, gone = (i for i in (1, 2, 3) if i != leader)
        work = Producers(wal, name).start()
        await work.wait_acks(100, timeout=30)
        cluster.nodes[gone].kill()
        await work.wait_acks(100, timeout=30)  # the slow one alone makes the majority
        mounts[slow].stall_syncs(STALL_S)
        await asyncio.sleep(STALL_S + LEASE_S)
        await work.wait_acks(100, timeout=30)  # writes flow again
        await work.stop()
        moved = (await cluster.leader(name), await cluster.term(name))
        assert moved == (leader, term), (
            f"node {leader} led {name} under term {term} before node {slow}'s disk stalled "
            f"for {STALL_S}s; after it (node, term) = {moved}"
        )
        await cluster.start_node(gone)
        await cluster.wait_healthy([name], timeout=60)
        verdict = await cluster.check(name, work.acked)
        assert verdict.ok, verdict.summary()
    finally:
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
