"""The operator with a replicated PChannel (spec.replicas 3): real kubectl against the real
kube-apiserver, the real operator process, real nodes. Status lists the replica set with
the leader; a failed leader's pod hands the pchannel to a follower under a higher term."""

from __future__ import annotations

import asyncio
import json

import pytest

from streamwal.client.wal import open_wal
from streamwal.operator.status import ready_reason
from streamwal.testing.history import Acked, check, payload, read_log
from tests.operator.conftest import Cluster, pchannel_yaml, wait_for


def roles(status: dict) -> dict[int, str]:
    return {r["id"]: r["role"] for r in status.get("replicas") or []}


def test_replicated_pchannel_status_shows_the_set_and_survives_its_leader(
    cluster: Cluster,
) -> None:
    for i in (1, 2, 3):
        cluster.add_node(i)
    cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-r", replicas=3))

    def placed() -> dict | None:
        obj = cluster.ready("ch-r")
        return obj if obj and len(roles(obj["status"])) == 3 else None

    before = wait_for(placed, 30, "ch-r Ready on 3 replicas")["status"]
    leader = before["node"]["id"]
    assert roles(before) == {n: "Leader" if n == leader else "Follower" for n in (1, 2, 3)}

    cluster.fail_node(leader)

    def moved() -> dict | None:
        obj = cluster.ready("ch-r")
        return obj if obj and obj["status"]["node"]["id"] != leader else None

    after = wait_for(moved, 30, "ch-r led by a follower")["status"]
    assert after["term"] > before["term"]
    # the failed node stays a member (it may come back); the new leader is a former follower
    assert set(roles(after)) == {1, 2, 3} and roles(after)[after["node"]["id"]] == "Leader"


def test_a_finished_replica_change_leaves_status_and_a_later_failover_works(
    cluster: Cluster,
) -> None:
    # Created while one node pod is missing: placed on the two there are, then grown to
    # three when the third appears (a joint configuration: previousReplicas, jointUntil).
    for i in (1, 2):
        cluster.add_node(i)
    cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-grow", replicas=3))
    wait_for(lambda: len(roles((cluster.get("ch-grow") or {}).get("status") or {})) == 2, 30)
    cluster.add_node(3)

    def grown() -> dict | None:
        obj = cluster.ready("ch-grow")
        status = (obj or {}).get("status") or {}
        done = len(roles(status)) == 3 and "previousReplicas" not in status
        return status if done and "jointUntil" not in status else None

    # The change finishes and its keys leave status (a merge patch deletes a key only
    # when it is written as null): a status still "in the middle" of a change would make
    # the next leader loss leave the pchannel Unavailable.
    before = wait_for(grown, 30, "ch-grow on 3 replicas, change finished")
    leader = before["node"]["id"]
    cluster.fail_node(leader)

    def moved() -> dict | None:
        obj = cluster.ready("ch-grow")
        return obj if obj and obj["status"]["node"]["id"] != leader else None

    after = wait_for(moved, 30, "ch-grow led by a follower")["status"]
    assert after["term"] > before["term"] and after["state"] == "Assigned"


def _patch_replicas(cluster: Cluster, name: str, replicas: int) -> None:
    body = json.dumps({"spec": {"replicas": replicas}})
    cluster.kubectl("patch", "pch", name, "--type=merge", "-p", body)


def _settled(cluster: Cluster, name: str, replicas: int) -> dict | None:
    """The status once Ready on `replicas` members with no change left half-finished."""
    obj = cluster.ready(name)
    status = (obj or {}).get("status") or {}
    members = len(roles(status)) or (1 if status.get("node") else 0)
    pending = "previousReplicas" in status or "jointUntil" in status
    return status if obj and members == replicas and not pending else None


def test_more_replicas_than_nodes_says_not_enough_nodes_until_they_appear(
    cluster: Cluster,
) -> None:
    for i in (1, 2, 3):
        cluster.add_node(i)
    cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-5", replicas=5))

    def short() -> dict | None:
        status = (cluster.get("ch-5") or {}).get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        placed = status.get("state") == "Assigned" and len(roles(status)) == 3
        return cond if placed and cond.get("reason") == "NotEnoughNodes" else None

    cond = wait_for(short, 30, "NotEnoughNodes on 3 of 5")
    assert cond["status"] == "False" and "3 of spec.replicas 5" in cond["message"]
    assert wait_for(lambda: [e for e in cluster.events("ch-5") if e.reason == "NotEnoughNodes"], 10)
    cluster.add_node(4)
    cluster.add_node(5)
    status = wait_for(lambda: _settled(cluster, "ch-5", 5), 40, "ch-5 on 5 replicas")
    assert set(roles(status)) == {1, 2, 3, 4, 5}
    assert not cluster.forbidden()


@pytest.mark.slow
async def test_replicas_1_3_1_under_a_producer_lose_and_duplicate_nothing(
    cluster: Cluster,
) -> None:
    """1 -> 3 -> 1 on a live PChannel while a routed producer sends: each change
    finishes (status shows no half-done change), a leader killed after each one is
    replaced (by a follower at 3; at 1 the pchannel waits for its node, safe failover,
    and returns there), and every acknowledged message is read back once, in order."""
    for i in (1, 2, 3):
        cluster.add_node(i)
    op = cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-rs", replicas=1))
    await asyncio.to_thread(wait_for, lambda: _settled(cluster, "ch-rs", 1), 30, "placed")

    async def kill_and_recover(replicas: int) -> None:
        before = cluster.get("ch-rs")["status"]
        leader = before["node"]["id"]
        cluster.fail_node(leader)

        def replaced() -> dict | None:
            status = _settled(cluster, "ch-rs", replicas)
            return status if status and status["term"] > before["term"] else None

        if replicas == 1:  # the only copy: it waits for its node (safe failover)
            await asyncio.to_thread(
                wait_for,
                lambda: ready_reason(cluster.get("ch-rs")["status"]) == "WaitingForReplica",
                20,
                "WaitingForReplica",
            )
            cluster.nodes[leader].start()
            cluster.set_ready(leader, True)
            after = await asyncio.to_thread(wait_for, replaced, 40, "back on its node")
            assert after["node"]["id"] == leader
        else:
            after = await asyncio.to_thread(wait_for, replaced, 40, "a follower leads")
            assert after["node"]["id"] != leader
            cluster.nodes[leader].start()  # back as a follower, for the next change
            cluster.set_ready(leader, True)

    acked: dict[int, int] = {}
    stop = asyncio.Event()
    async with await open_wal(coord=f"127.0.0.1:{op.coord_port}", failover_timeout=60) as wal:
        producer = await wal.producer("ch-rs")

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                acked[i] = (await producer.send(payload("p", i))).offset
                i += 1

        work = asyncio.create_task(produce())
        try:
            for replicas in (3, 1):
                await asyncio.to_thread(wait_for, lambda: len(acked) >= 100, 30, "acks")
                _patch_replicas(cluster, "ch-rs", replicas)
                await asyncio.to_thread(
                    wait_for, lambda r=replicas: _settled(cluster, "ch-rs", r), 40, "changed"
                )
                more = len(acked) + 100
                await asyncio.to_thread(wait_for, lambda m=more: len(acked) >= m, 30, "acks")
                await kill_and_recover(replicas)
            settled = len(acked)
            await asyncio.to_thread(wait_for, lambda: len(acked) >= settled + 100, 30)
        finally:
            stop.set()
            await asyncio.wait_for(work, 60)
        await producer.close()
        end = await wal.end_offset("ch-rs")
        consumer = await wal.consumer("ch-rs", end_offset=end)
        seen = [(m.offset, m.payload) async for m in consumer]
        await consumer.close()
    verdict = check(
        [read_log("ch-rs as consumed", seen)], [Acked("p", i, o) for i, o in acked.items()]
    )
    assert verdict.ok, verdict.summary()
    events = {e.reason for e in cluster.events("ch-rs")}
    assert "UncleanFailover" not in events
    assert not cluster.forbidden()
