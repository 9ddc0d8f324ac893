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
