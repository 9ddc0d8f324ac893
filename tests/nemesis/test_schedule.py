"""A seeded schedule of mixed faults against a 3-replica pchannel under load, as Jepsen's
combined nemesis: processes killed and paused (leader, follower, coord), the leader cut
off from its followers, the leader cut off from everyone (it lives on, a zombie of its
old term). Nodes sit in their own network namespaces.

The schedule (faults, victims, durations) comes from the test's seed: a failure prints it,
and ``--nemesis-seed N`` (or STREAMWAL_NEMESIS_SEED=N) replays it. CI runs a short
schedule of distinct faults; ``--nemesis-long`` (STREAMWAL_NEMESIS_LONG=1) runs 40 steps.
Every step must keep issue 22's promise (writes stop for at most grace + 1 s), and the
whole history must check out at the end (nothing acknowledged lost, duplicated or
acknowledged twice; replicas agree; no consumer saw what the final log does not hold).
"""

from __future__ import annotations

import time

import pytest

from tests.nemesis.scenarios import GRACE, PROBE, RECOVERY, LoadedCluster, Outcome

FAULTS = (
    "kill-leader",
    "kill-follower",
    "pause-leader",
    "pause-follower",
    "partition-leader",
    "isolate-leader",
    "kill-coord",
    "pause-coord",
)
SHORT = 5
LONG = 40
SETTLE = 30.0  # seconds for writes to flow again after a step is healed


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_seeded_schedule_of_faults(nemesis) -> None:
    rng = nemesis.rng
    kinds = [rng.choice(FAULTS) for _ in range(LONG)] if nemesis.long else rng.sample(FAULTS, SHORT)
    network = nemesis.network(3)
    load = LoadedCluster(nemesis.cluster(3, network=network, grace=GRACE, probe_interval=PROBE))
    cluster = load.cluster
    steps: list[Outcome] = []
    print(f"nemesis schedule (seed {nemesis.seed}): {kinds}")
    try:
        await load.start()
        for kind in kinds:
            leader = await load.leader()
            follower = rng.choice([n for n in (1, 2, 3) if n != leader])
            what, role = kind.split("-")
            victim = {"leader": leader, "follower": follower, "coord": 0}[role]
            node = cluster.nodes.get(victim)
            if kind == "kill-coord":
                inject, heal = cluster.kill_coord, cluster.start_coord
            elif kind == "pause-coord":
                inject, heal = cluster.pause_coord, cluster.resume_coord
            elif what == "kill":
                inject, heal = node.kill, (lambda v=victim: cluster.start_node(v))
            elif what == "pause":
                inject, heal = node.pause, node.resume
            else:
                others = [n for n in (1, 2, 3) if n != victim]
                gateway = what == "isolate"
                inject = lambda v=victim, o=others, g=gateway: network.isolate(v, o, g)  # noqa: E731
                heal = lambda v=victim: network.heal(v)  # noqa: E731
            hold = rng.uniform(1.0, 4.0)
            outcome = await load.fault(
                kind, victim, inject, heal, hold=hold, patience=hold + RECOVERY + 1.0
            )
            outcome.notes.append(f"held {hold:.1f}s")
            # Writes flow again before the next fault, so each step's gap is its own.
            settled = await load.producers.wait_ack_after(time.monotonic(), SETTLE)
            outcome.notes.append(
                f"writes again {settled:.2f}s after healing"
                if settled is not None
                else f"no write {SETTLE:.0f}s after healing"
            )
            steps.append(outcome)
            print(f"step {len(steps)}: {outcome.summary()}")
            assert settled is not None, f"writes never resumed after step {len(steps)}"
        final = await load.finish()
        print(f"history: {final.verdict.summary()[:3000]}; read back {final.read}")
        problems = [
            f"step {i} {s.fault} of {s.victim}: writes stopped for {s.gap:.2f}s"
            for i, s in enumerate(steps, 1)
            if s.gap is not None and s.gap > RECOVERY
        ]
        if not final.verdict.ok:
            problems.append(f"history: {final.verdict.summary()[:3000]}")
        if final.twice:
            problems.append(f"offsets acknowledged twice: {final.twice[:5]}")
        assert not problems, f"promise {RECOVERY}s:\n" + "\n".join(problems)
    finally:
        cluster.resume_coord()
        for node in cluster.nodes.values():
            node.resume()
        await load.close()
