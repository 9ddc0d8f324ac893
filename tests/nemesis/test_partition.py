"""A leader cut off from its followers while the coord still reaches it.

Nodes run in their own network namespaces on a bridge (`faults.Network`); the coord and
the clients are in the root namespace. iptables in the leader's namespace drops every
packet to and from the followers, established connections included: the leader cannot
reach a quorum, the coord sees it alive. Issue 22: it steps down within a lease, the
pchannel moves, producers write again within grace + 1 s, nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.coord.node_link import NodeLinks
from streamwal.coord.pinger import Pinger
from streamwal.errors import StreamingError
from streamwal.testing.local_node import LocalNode
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


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_node_cut_off_from_the_coord_is_heard_at_once_when_healed(nemesis) -> None:
    """A partition leaves the coord's connections to the node resending at TCP's
    backed-off retransmission times: without new connections the healed node was heard
    2 s or more later, and a second fault in that window stopped writes past the promise
    (seeded schedule 112700). The coord's pings and its calls answer within a second."""
    network = nemesis.network(1)
    node = LocalNode(nemesis.root / "node1", node_id=1, host=network.address(1))
    pinger = Pinger(PROBE, max_stall=5.0)
    links = NodeLinks()
    try:
        await asyncio.to_thread(network.run_in, 1, node.start)
        status = await links.collect_status(node.address, timeout=5.0)
        pinger.watch(1, f"{network.address(1)}:{status.probe_port}")
        pinger.start()

        async def answered(call, since: float, within: float) -> float:
            """Seconds from `since` to the first success of `call` (bounded)."""
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                if await call():
                    return time.monotonic() - since
                await asyncio.sleep(0.05)
            raise AssertionError(f"no answer within {within}s")

        async def pinged() -> bool:
            return any(h.ok for h in pinger.drain())

        async def status_answered() -> bool:
            try:
                await links.collect_status(node.address, timeout=PROBE)
            except StreamingError:
                return False
            return True

        await answered(pinged, time.monotonic(), 5.0)
        network.isolate(1, [], gateway=True)
        deadline = time.monotonic() + 3.5  # calls go into the loss meanwhile
        while time.monotonic() < deadline:
            assert not await status_answered()
            pinger.drain()
        network.heal(1)
        healed = time.monotonic()
        heard = await answered(pinged, healed, 10.0)
        links.reconnect(node.address)  # what the coord does when the node is live again
        called = await answered(status_answered, healed, 10.0)
        assert heard <= 1.5 and called <= 1.5, f"pinged after {heard:.2f}s, called {called:.2f}s"
    finally:
        pinger.stop()
        await links.close()
        node.kill()
