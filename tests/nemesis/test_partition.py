"""A leader cut off from its followers while the coord still reaches it.

Nodes run in their own network namespaces on a bridge (`faults.Network`); the coord and
the clients are in the root namespace. iptables in the leader's namespace drops every
packet to and from the followers, established connections included: the leader cannot
reach a quorum, the coord sees it alive. Issue 22: it steps down within a lease, the
pchannel moves, producers write again within grace + 1 s, nothing acknowledged is lost.
"""

from __future__ import annotations

import pytest

from tests.nemesis.scenarios import GRACE, PROBE, LoadedCluster, assert_promise


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_leader_cut_off_from_its_followers_only(nemesis) -> None:
    network = nemesis.network(3)
    load = LoadedCluster(nemesis.cluster(3, network=network, grace=GRACE, probe_interval=PROBE))
    try:
        await load.start()
        leader = await load.leader()
        followers = [n for n in (1, 2, 3) if n != leader]
        outcome = await load.fault(
            "partition from followers",
            leader,
            lambda: network.isolate(leader, followers),
            lambda: network.heal(leader),
            hold=nemesis.rng.uniform(2.5, 4.0),
        )
        assert_promise(await load.finish(outcome))
    finally:
        await load.close()
