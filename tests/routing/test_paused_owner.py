"""A paused owner no longer holds a routed producer past the failover (issues 19 and 22).

A SIGSTOPped leader keeps its TCP connections: its kernel acknowledges what producers
write, so their streams neither break nor get answers. The coord declares it lost after
its grace period and assigns the pchannel under a newer term to a follower; the routed
producers follow that assignment at once -- detach what the paused leader never
answered, resend it to the new leader with its sequence numbers, carry on. The old
leader stays paused for the whole test, so nothing it does can help.

Real processes: a coord and 3 nodes (`LocalCluster`), one pchannel with 3 replicas, the
fault test's workload (tests/replication/test_fault.py: two routed producers with 8 sends
in flight each) at the default options: the request deadline (10 s) is far above the
bound checked here, so only the assignment can move them in time. Checked: every send
pending at the pause, and the first send after it, complete within the coord's grace
period plus BOUND; then the two live replicas hold every acknowledged message exactly
once, at its acknowledged offset, in per-producer order (streamwal.testing.history).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.client.wal import open_wal
from streamwal.errors import Unavailable
from streamwal.testing.history import check
from streamwal.testing.replica_logs import read_replicas
from tests.replication.test_fault import Workload
from tests.support import wait_for

GRACE = 1.0  # the coord's (probes every 0.25 s)
# Past the grace: the probe that finds the leader lost (<= 0.25 s), the coord's term change
# (fence the followers, pick one, assign it), the push of the new assignment, the reopen
# and the resend. Measured: sends complete 0.9 s after the pause (the grace counts from the
# last answered probe); the margin is for a loaded 2-core machine.
BOUND = 3.0


async def test_a_paused_leader_holds_no_producer_past_the_failover(make_cluster) -> None:
    cluster = await make_cluster(nodes=3, grace=GRACE)
    (name,) = await cluster.create_channels(1, prefix="paused", replicas=3)
    async with await open_wal(cluster.coord_address, failover_timeout=30) as wal:
        await wal.resolve(name, timeout=30)
        await wait_for(lambda: cluster.replicas_healthy(name), 30, 0.1, "3 healthy replicas")
        work = Workload(wal, name)
        try:
            await work.start()
            await wait_for(lambda: len(work.acked) >= 200, 30, 0.02, "acks")
            before = (await cluster.describe())[name]
            leader, term = before.meta.node.server_id, before.meta.channel.term
            cluster.nodes[leader].pause()
            paused_at = time.monotonic()

            def completed() -> float | None:
                """Seconds from the pause until every send pending then was answered and
                a send made after it was too (None: not yet)."""
                pending = [done for sent, done in work.ack_times if sent < paused_at < done]
                after = [done for sent, done in work.ack_times if sent > paused_at]
                return max([min(after), *pending]) - paused_at if after else None

            await wait_for(lambda: completed() is not None, 60, 0.02, "sends after the pause")
            window = completed()
            assert window is not None
            moved = (await cluster.describe())[name]
            reroutes = [r for p in work.producers for r in p.reroutes]
            print(
                f"\nleader {leader} (term {term}) paused: sends complete on node "
                f"{moved.meta.node.server_id} (term {moved.meta.channel.term}) after "
                f"{window:.2f}s (grace {GRACE}s + bound {BOUND}s); reroutes: "
                + ", ".join(f"{r.seconds:.2f}s resending {r.resent}" for r in reroutes)
            )
            assert window <= GRACE + BOUND, f"sends waited {window:.2f}s for the paused leader"
            assert moved.meta.node.server_id != leader and moved.meta.channel.term > term
            for p in work.producers:
                assert p.reroutes, f"{p.producer_id} never moved"
                assert p.route is not None and p.route.server_id != leader
            await asyncio.sleep(0.3)  # a little more traffic on the new leader
        finally:
            await work.close()
        assert work.failed == 0, "sends failed"

        final = (await cluster.describe())[name]
        live = {m.server_id: m.address for m in final.members if m.server_id != leader}
        verdict = check(await read_replicas(live, name), work.acked)
        print(verdict.summary())
        assert verdict.ok, verdict.summary()


async def test_closing_answers_every_send_even_while_the_owner_is_paused(make_cluster) -> None:
    """A routed producer's close is bounded, and closing the client under a producer ends
    it too: every send still waiting on the paused owner fails with a clear error."""
    cluster = await make_cluster(nodes=1, grace=30)
    (name,) = await cluster.create_channels(1)
    async with await open_wal(cluster.coord_address) as wal:
        closed, orphaned = await wal.producer(name), await wal.producer(name)
        await closed.send(b"before")
        await orphaned.send(b"before")
        cluster.nodes[1].pause()
        stuck = [asyncio.ensure_future(p.send(b"stuck")) for p in (closed, orphaned)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await asyncio.wait_for(closed.close(timeout=0.5), 10)
        assert time.monotonic() - started >= 0.5
        with pytest.raises(Unavailable, match="closed before its sends were answered"):
            await stuck[0]
        with pytest.raises(Unavailable, match="closed"):
            await closed.send(b"after close")
    with pytest.raises(Unavailable, match="the client was closed"):
        await asyncio.wait_for(stuck[1], 10)
