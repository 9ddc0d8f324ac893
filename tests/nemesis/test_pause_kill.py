"""Processes that stop: a leader paused (SIGSTOP) or killed (SIGKILL), the coord paused or
killed, under load on a 3-replica pchannel.

- A paused leader is a gray failure: its connections stay open, nothing answers. Issue
  22: producers detect it (per-request deadline, keepalive) and write to the new leader
  within grace + 1 s; the old leader, resumed, neither accepts nor exposes anything.
- A killed leader: the same bound (test_fault.py covers many kills; here it is one
  fault of the schedule and the bound is asserted).
- The coord paused or killed: the data path does not need it, so writes never stop
  (the same bound, measured from the fault); a restarted coord keeps every term.
"""

from __future__ import annotations

import pytest

from tests.nemesis.scenarios import GRACE, PROBE, LoadedCluster, assert_promise


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", ["leader", "coord"])
@pytest.mark.parametrize("fault", ["pause", "kill"])
async def test_leader_or_coord_paused_or_killed(nemesis, victim: str, fault: str) -> None:
    load = LoadedCluster(nemesis.cluster(3, grace=GRACE, probe_interval=PROBE))
    try:
        await load.start()
        cluster = load.cluster
        term = await cluster.term(load.name)
        if victim == "coord":
            node_id = 0
            inject, heal = {
                "pause": (cluster.pause_coord, cluster.resume_coord),
                "kill": (cluster.kill_coord, cluster.start_coord),
            }[fault]
        else:
            node_id = await load.leader()
            node = cluster.nodes[node_id]
            inject, heal = {
                "pause": (node.pause, node.resume),
                "kill": (node.kill, lambda: cluster.start_node(node_id)),
            }[fault]
        outcome = await load.fault(
            f"{victim} {fault}", node_id, inject, heal, hold=nemesis.rng.uniform(2.5, 4.0)
        )
        outcome = await load.finish(outcome)
        if victim == "leader":
            assert await cluster.term(load.name) > term, "the pchannel never moved"
        else:
            assert await cluster.term(load.name) >= term, "a term went back"
        assert_promise(outcome)
    finally:
        await load.close()
