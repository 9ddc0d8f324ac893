"""A rolling restart of the streaming-node pods under running producers, on the real API
server: each pod is deleted (gracefully: it is scheduled, so the API server only marks
it), the operator drains it while the chart's preStop hook (`streamwal wait-drained`)
waits for its leaderships to move, then the kubelet's part is played (SIGTERM, the pod
removed) and the StatefulSet's (the pod recreated on the same volume). Every
acknowledged message must be read back once, in order, and nothing may fail over: every
move is a handover or a move with the log, never a failover nor an unclean one."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

from streamwal.client.wal import open_wal
from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL
from streamwal.testing.history import Acked, check, payload, read_log
from tests.operator.conftest import RELEASE, Cluster, collect_status, pchannel_yaml, wait_for

NAMES = {"ch-roll3": 3, "ch-roll1": 1}
NOT_A_MOVE = {"Failover", "UncleanFailover", "WaitingForReplica"}
# The operator's log lines that say why a pchannel failed over (printed on failure).
WHY = re.compile(r"failover|liveness changed|node down|unhealthy|lease")


def _kube_node(i: int) -> str:
    return f"kube-node-{i}"


def _settled(cluster: Cluster) -> bool:
    """Every PChannel Ready with no change pending, every replica served by its node."""
    for name, replicas in NAMES.items():
        obj = cluster.ready(name)
        status = (obj or {}).get("status") or {}
        if not obj or "previousReplicas" in status:
            return False
        members = [r["id"] for r in status.get("replicas") or []] or [status["node"]["id"]]
        if len(members) != replicas:
            return False
        for node in members:
            try:
                served = collect_status(cluster.nodes[node].address)
            except Exception:
                return False
            if served.get(name) != status["term"]:
                return False
    return True


@pytest.mark.slow
async def test_deleting_node_pods_one_by_one_under_load_loses_and_fails_over_nothing(
    cluster: Cluster,
) -> None:
    for i in (1, 2, 3):
        cluster.add_node(i, node_name=_kube_node(i))
    # The chart's liveness settings: a rolling restart at a 1 s grace would also test
    # that no healthy node misses a second of probes on this loaded machine.
    op = cluster.start_operator(
        "--grace", str(DEFAULT_GRACE), "--probe-interval", str(DEFAULT_PROBE_INTERVAL)
    )  # fmt: skip
    for name, replicas in NAMES.items():
        cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml(name, replicas=replicas))
    await asyncio.to_thread(wait_for, lambda: _settled(cluster), 40, "placed")

    acked: dict[str, dict[int, int]] = {name: {} for name in NAMES}
    stop = asyncio.Event()
    async with await open_wal(coord=f"127.0.0.1:{op.coord_port}", failover_timeout=60) as wal:
        producers = {name: await wal.producer(name) for name in NAMES}

        async def produce(name: str) -> None:
            i = 0
            while not stop.is_set():
                acked[name][i] = (await producers[name].send(payload(name, i))).offset
                i += 1

        def total() -> int:
            return sum(len(a) for a in acked.values())

        work = [asyncio.create_task(produce(name)) for name in NAMES]
        try:
            for i in (1, 2, 3):
                more = total() + 200
                await asyncio.to_thread(wait_for, lambda m=more: total() >= m, 30, "acks")
                pod = f"{RELEASE}-streamwal-node-{i}"
                cluster.kubectl("delete", "pod", pod, "--wait=false")
                # The chart's preStop hook, as the kubelet would run it.
                hook = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "streamwal", "wait-drained",
                    "--address", cluster.nodes[i].address, "--timeout", "30s",
                )  # fmt: skip
                assert await asyncio.wait_for(hook.wait(), 40) == 0, f"node {i} not drained"
                cluster.nodes[i].stop()  # SIGTERM once the hook returned
                cluster.kubectl("delete", "pod", pod, "--grace-period=0", "--force")
                cluster.add_node(i, node_name=_kube_node(i))  # same volume, new pod
                await asyncio.to_thread(wait_for, lambda: _settled(cluster), 60, "rejoined")
            more = total() + 200
            await asyncio.to_thread(wait_for, lambda m=more: total() >= m, 30, "acks")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*work), 60)
        verdicts = {}
        for name, producer in producers.items():
            await producer.close()
            end = await wal.end_offset(name)
            consumer = await wal.consumer(name, end_offset=end)
            seen = [(m.offset, m.payload) async for m in consumer]
            await consumer.close()
            verdicts[name] = check(
                [read_log(name, seen)], [Acked(name, i, o) for i, o in acked[name].items()]
            )
    for name, verdict in verdicts.items():
        assert verdict.ok, f"{name}: {verdict.summary()}"
    print(f"\nrolling restart of 3 node pods: {dict((n, len(a)) for n, a in acked.items())} acked")
    moved = {
        name: [f"{e.reason}: {e.message}" for e in cluster.events(name) if e.reason in NOT_A_MOVE]
        for name in NAMES
    }
    why = [line for line in op.text().splitlines() if WHY.search(line)]
    assert not any(moved.values()), f"{moved}; the operator's log: {why[-20:]}"
    assert '"unclean failover"' not in op.text() and '"failover done"' not in op.text(), why
    assert not cluster.forbidden()
