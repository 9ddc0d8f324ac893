"""spec.placement acts, on the real API server: a node selector no live node pod matches
leaves the PChannel Ready=False, reason Unschedulable (never a silent fallback); labelling
a pod makes it eligible and the pchannel is placed there; changing the selector moves it,
with its log, to a node that matches."""

from __future__ import annotations

import json

from tests.operator.conftest import RELEASE, Cluster, pchannel_yaml, wait_for


def _reason(cluster: Cluster, name: str) -> str:
    status = (cluster.get(name) or {}).get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return cond.get("reason", "")


def test_a_placement_no_node_matches_is_unschedulable_then_acts(cluster: Cluster) -> None:
    for i in (1, 2, 3):
        cluster.add_node(i)
    cluster.start_operator()
    spec = {"placement": {"nodeSelector": {"disk": "nvme"}}}
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-p", **spec))
    wait_for(lambda: _reason(cluster, "ch-p") == "Unschedulable", 20, "Unschedulable")
    status = cluster.get("ch-p")["status"]
    assert status["state"] == "Pending" and "disk=nvme" in status["conditions"][0]["message"]
    assert wait_for(lambda: [e for e in cluster.events("ch-p") if e.reason == "Unschedulable"], 10)

    cluster.kubectl("label", "pod", f"{RELEASE}-streamwal-node-2", "disk=nvme")
    obj = wait_for(lambda: cluster.ready("ch-p"), 30, "ch-p placed on the labelled node")
    assert obj["status"]["node"]["id"] == 2

    cluster.kubectl("label", "pod", f"{RELEASE}-streamwal-node-3", "zone=b")
    body = json.dumps({"spec": {"placement": {"nodeSelector": {"disk": None, "zone": "b"}}}})
    cluster.kubectl("patch", "pch", "ch-p", "--type=merge", "-p", body)

    def moved() -> dict | None:
        obj = cluster.ready("ch-p")
        return obj if obj and obj["status"]["node"]["id"] == 3 else None

    after = wait_for(moved, 30, "ch-p moved to the node the new selector matches")
    assert after["status"]["term"] > obj["status"]["term"]
    assert "UncleanFailover" not in {e.reason for e in cluster.events("ch-p")}
    assert not cluster.forbidden()
