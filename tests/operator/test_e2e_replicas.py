"""The operator with a replicated PChannel (spec.replicas 3): real kubectl against the real
kube-apiserver, the real operator process, real nodes. Status lists the replica set with
the leader; a failed leader's pod hands the pchannel to a follower under a higher term."""

from __future__ import annotations

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
