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

A node usually leads some pchannels and follows others, so the same holds for a node
whose disk stalls while it writes as a leader: its loop must go on sending heartbeats
for the pchannels it follows.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from streamwal.client.wal import WAL, open_wal
from tests.nemesis.cluster import NemesisCluster
from tests.nemesis.faults import LazyMount
from tests.nemesis.history import Producers
from tests.nemesis.scenarios import GRACE, PROBE

LEASE_S = 1.0  # the node's default --quorum-lease
STALL_S = 3 * LEASE_S


async def _lazy_cluster(nemesis) -> tuple[dict[int, LazyMount], NemesisCluster]:
    """Three nodes, each on a lazyfs mount whose fsyncs can be stalled, and a coord."""
    mounts = {i: nemesis.lazy_mount(nemesis.root / f"node{i}") for i in (1, 2, 3)}
    cluster = nemesis.cluster(3, grace=GRACE, probe_interval=PROBE)
    await cluster.start()
    return mounts, cluster


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_follower_whose_disk_stalls_keeps_its_leader_in_office(nemesis) -> None:
    mounts, cluster = await _lazy_cluster(nemesis)
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


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_leader_whose_disk_stalls_still_heartbeats_for_what_it_follows(nemesis) -> None:
    mounts, cluster = await _lazy_cluster(nemesis)
    names = await cluster.create_channels(3, prefix="both", replicas=3)
    wal: WAL | None = None
    work: list[Producers] = []
    try:
        wal = await open_wal(cluster.coord_address, failover_timeout=20)
        for name in names:
            await wal.resolve(name, timeout=30)
        await cluster.wait_healthy(names)
        leaders = {name: await cluster.leader(name) for name in names}
        assert sorted(leaders.values()) == [1, 2, 3], leaders  # one pchannel led by each
        slow, other, gone = 1, 2, 3
        [led] = [n for n in names if leaders[n] == slow]  # the slow node leads it
        [followed] = [n for n in names if leaders[n] == other]  # and follows this one
        cluster.nodes[gone].kill()
        work = [Producers(wal, name, count=1, window=1).start() for name in (led, followed)]
        for producers in work:
            await producers.wait_acks(50, timeout=30)
        terms = {name: await cluster.term(name) for name in (led, followed)}
        mounts[slow].stall_syncs(STALL_S)
        await asyncio.sleep(STALL_S + LEASE_S)
        for producers in work:
            await producers.wait_acks(50, timeout=30)  # writes flow again
            await producers.stop()
        moved = {name: (await cluster.leader(name), await cluster.term(name)) for name in terms}
        assert moved[followed] == (other, terms[followed]), (
            f"node {other} led {followed} (followed by node {slow}) under term "
            f"{terms[followed]} before node {slow}'s disk stalled for {STALL_S}s while it "
            f"wrote as {led}'s leader; after it (node, term) = {moved[followed]}"
        )
        assert moved[led] == (slow, terms[led]), (
            f"node {slow} led {led} under term {terms[led]} before its disk stalled for "
            f"{STALL_S}s; after it (node, term) = {moved[led]}"
        )
        await cluster.start_node(gone)
        await cluster.wait_healthy(names, timeout=60)
        for producers in work:
            verdict = await cluster.check(producers.pchannel, producers.acked)
            assert verdict.ok, verdict.summary()
    finally:
        for producers in work:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producers.stop(), 10)
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
