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
@pytest.mark.parametrize("fault", ["pause", "kill"])
async def test_leader_paused_or_killed(nemesis, fault: str) -> None:
    load = LoadedCluster(nemesis.cluster(3, grace=GRACE, probe_interval=PROBE))
    try:
        await load.start()
        leader = await load.leader()
        node = load.cluster.nodes[leader]
        term = await load.cluster.term(load.name)
        inject, heal = (
            (node.pause, node.resume)
            if fault == "pause"
            else (node.kill, lambda: load.cluster.start_node(leader))
        )
        outcome = await load.fault(
            f"leader {fault}", leader, inject, heal, hold=nemesis.rng.uniform(2.5, 4.0)
        )
        outcome = await load.finish(outcome)
        assert await load.cluster.term(load.name) > term, "the pchannel never moved"
        assert_promise(outcome)
    finally:
        await load.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["pause", "kill"])
async def test_coord_paused_or_killed(nemesis, fault: str) -> None:
    load = LoadedCluster(nemesis.cluster(3, grace=GRACE, probe_interval=PROBE))
    try:
        await load.start()
        cluster = load.cluster
        term = await cluster.term(load.name)
        inject, heal = (
            (cluster.pause_coord, cluster.resume_coord)
            if fault == "pause"
            else (cluster.kill_coord, cluster.start_coord)
        )
        outcome = await load.fault(
            f"coord {fault}", 0, inject, heal, hold=nemesis.rng.uniform(2.0, 4.0)
        )
        acks_during = load.producers.acks_since(0)
        outcome = await load.finish(outcome)
        outcome.notes.append(f"{acks_during} acks in all")
        assert await cluster.term(load.name) >= term, "a term went back"
        assert_promise(outcome)
    finally:
        await load.close()
