"""The operator end to end: real kubectl, the real operator process (Kopf), real nodes.

What users rely on: applying a PChannel gets it served by a node under a term that
`kubectl get pch` shows; a failed node's single copy waits for it (safe failover) unless
data loss is allowed, then comes back on another node under a higher term, Ready again,
with an Event saying so; deleting a PChannel releases it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time

import grpc
import yaml

from streamwal.client.node_client import NodeClient
from streamwal.operator.handlers import FINALIZER
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg
from tests.operator.conftest import (
    Cluster,
    G,
    P,
    V,
    collect_status,
    log_time,
    pchannel_yaml,
    wait_for,
)


def test_apply_assigns_to_real_nodes_and_kubectl_shows_node_and_term(cluster: Cluster) -> None:
    cluster.add_node(1)
    cluster.add_node(2)
    op = cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-a", "ch-b", "ch-c"))

    objs = {
        n: wait_for(lambda n=n: cluster.ready(n), 30, f"{n} Ready")
        for n in ("ch-a", "ch-b", "ch-c")
    }
    served = {i: collect_status(n.address) for i, n in cluster.nodes.items()}
    for name, obj in objs.items():
        st = obj["status"]
        assert st["term"] >= 1
        assert served[st["node"]["id"]].get(name) == st["term"], (name, st, served)
        assert st["node"]["address"] == cluster.nodes[st["node"]["id"]].address
        cond = st["conditions"][0]
        assert cond["reason"] == "Assigned" and f"term {st['term']}" in cond["message"]
    # Both nodes got work (the balancer spreads new channels).
    assert {o["status"]["node"]["id"] for o in objs.values()} == {1, 2}
    # GitOps: spec is the user's alone. The server records who wrote which field. Kopf
    # keeps no state on the objects either.
    for obj in objs.values():
        annotations = obj["metadata"].get("annotations") or {}
        assert not [a for a in annotations if a.startswith("streamwal.io")], annotations
        for entry in obj["metadata"]["managedFields"]:
            if "f:spec" in entry.get("fieldsV1", {}):
                assert entry["manager"].startswith("kubectl"), entry
            else:
                assert entry.get("subresource") == "status" or entry["manager"].startswith(
                    "kubectl"
                ), entry

    table = cluster.kubectl("get", "pch", "-o", "wide").stdout.splitlines()
    header = table[0].split()
    assert header[:6] == ["NAME", "NODE", "TERM", "STATE", "REPLICAS", "READY"], table
    for row in table[1:]:
        cells = row.split()
        st = objs[cells[0]]["status"]
        assert cells[1:5] == [str(st["node"]["id"]), str(st["term"]), "Assigned", "1"], row
        assert cells[5] == "True"

    assert wait_for(lambda: any(e.reason == "Assigned" for e in cluster.events("ch-a")), 10)

    # Clients learn the same assignment from AssignmentDiscover served beside the operator.
    # (The status patch and the discovery push are separate steps of the reconcile, so
    # a client may see one a moment before the other.)
    expected = {n: (o["status"]["node"]["address"], o["status"]["term"]) for n, o in objs.items()}
    assert wait_for(lambda: discovered(op.coord_port) == expected, 10, "discovery caught up")


def test_under_the_charts_rbac_the_first_pchannel_is_served_within_5_s(
    cluster: Cluster,
) -> None:
    """The chart's Role once stalled the operator for 54 s (Kopf listing namespaces,
    refused); the cluster fixture fails on any 403 in the operator's log. Timed from the
    operator's "operator started" (the interpreter's imports take seconds on a loaded
    machine and say nothing about RBAC)."""
    cluster.add_node(1)
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-first"))
    op = cluster.start_operator()
    wait_for(lambda: cluster.ready("ch-first"), 10, "ch-first Ready")
    started = log_time(op.text(), "operator started")
    assert started is not None and time.time() - started < 5.0


def discovered(port: int) -> dict[str, tuple[str, int]]:
    """{pchannel: (address, term)} from the first full assignment AssignmentDiscover sends."""
    requests: queue.Queue = queue.Queue()

    def commands():
        while (item := requests.get()) is not None:
            yield item

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stream = pbg.StreamingCoordAssignmentServiceStub(ch).AssignmentDiscover(
            commands(), timeout=10
        )
        try:
            first: pb.AssignmentDiscoverResponse = next(stream)
        finally:
            requests.put(None)
            stream.cancel()
    return {
        c.name: (a.node.address, c.term)
        for a in first.full_assignment.assignments
        for c in a.channels
    }


def _condition(cluster: Cluster, name: str) -> dict:
    status = (cluster.get(name) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


async def _produce(address: str, name: str, term: int, count: int) -> list[int]:
    async with NodeClient(address) as c:
        producer = await c.producer(name, term)
        results = await producer.send_many([b"m%d" % i for i in range(count)])
        await producer.close()
    return [r.offset for r in results]


def test_a_failed_single_copy_waits_for_its_node_and_returns_with_its_log(
    cluster: Cluster,
) -> None:
    """Safe failover by default: the only copy's node pod fails, another node is Ready,
    and the pchannel does not move without its records; it says why, and when the pod is
    back (same volume) it is served there again and its log continues."""
    cluster.add_node(1)
    cluster.add_node(2)
    cluster.start_operator()  # --grace 1.0: the wait below is not the grace
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-f"))
    before = wait_for(lambda: cluster.ready("ch-f"), 30, "ch-f Ready")["status"]
    victim = before["node"]["id"]
    acked = asyncio.run(_produce(cluster.nodes[victim].address, "ch-f", before["term"], 500))

    cluster.fail_node(victim)
    cond = wait_for(
        lambda: (c := _condition(cluster, "ch-f")).get("reason") == "WaitingForReplica" and c,
        20,
        "the WaitingForReplica condition",
    )
    assert cond["status"] == "False" and f"node {victim}" in cond["message"]
    assert wait_for(
        lambda: [e for e in cluster.events("ch-f") if e.reason == "WaitingForReplica"], 10
    )
    time.sleep(3)  # three graces: still waiting, nothing moved
    status = cluster.get("ch-f")["status"]
    assert status["state"] == "Unavailable" and status["node"]["id"] == victim
    assert _condition(cluster, "ch-f")["reason"] == "WaitingForReplica"

    cluster.nodes[victim].start()  # the pod recreated on its volume
    cluster.set_ready(victim, True)
    after = wait_for(lambda: cluster.ready("ch-f"), 30, "ch-f served again")["status"]
    assert after["node"]["id"] == victim and after["term"] > before["term"]
    more = asyncio.run(_produce(cluster.nodes[victim].address, "ch-f", after["term"], 1))
    assert more[0] > max(acked)  # its own log, continued
    reasons = {e.reason for e in cluster.events("ch-f")}
    assert "UncleanFailover" not in reasons
    assert not cluster.forbidden()


def test_a_failed_node_pod_fails_over_when_data_loss_is_allowed(cluster: Cluster) -> None:
    cluster.add_node(1)
    cluster.add_node(2)
    cluster.start_operator()
    cluster.kubectl(
        "apply", "-f", "-", stdin=pchannel_yaml("ch-u", failover={"allowDataLoss": True})
    )
    before = wait_for(lambda: cluster.ready("ch-u"), 30, "ch-u Ready")["status"]

    victim = before["node"]["id"]
    survivor = 2 if victim == 1 else 1
    cluster.fail_node(victim)

    def moved() -> dict | None:
        obj = cluster.ready("ch-u")
        return obj if obj and obj["status"]["node"]["id"] == survivor else None

    after = wait_for(moved, 30, "ch-u on the survivor")["status"]
    assert after["term"] > before["term"]
    assert collect_status(cluster.nodes[survivor].address)["ch-u"] == after["term"]
    failovers = wait_for(lambda: [e for e in cluster.events("ch-u") if e.reason == "Failover"], 10)
    assert f"term {after['term']}" in failovers[0].message
    assert f"was node {victim}" in failovers[0].message
    assert wait_for(
        lambda: [e for e in cluster.events("ch-u") if e.reason == "UncleanFailover"], 10
    )


def test_status_says_why_when_no_node_can_take_it(cluster: Cluster) -> None:
    cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-wait"))

    def waiting() -> dict | None:
        st = (cluster.get("ch-wait") or {}).get("status") or {}
        cond = (st.get("conditions") or [{}])[0]
        return (
            st if cond.get("reason") == "NoLiveNode" and st.get("observedGeneration") == 1 else None
        )

    st = wait_for(waiting, 20, "NoLiveNode condition")
    assert st["state"] == "Pending" and st["conditions"][0]["status"] == "False"
    # A node appears: the channel gets placed without any user action.
    cluster.add_node(1)
    assert wait_for(lambda: cluster.ready("ch-wait"), 30)["status"]["node"]["id"] == 1
    # A spec change bumps generation; the operator reports having seen it.
    cluster.kubectl(
        "patch",
        "pch",
        "ch-wait",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"retention": {"age": "1h"}}}),
    )
    obj = wait_for(
        lambda: (
            cluster.ready("ch-wait")
            if cluster.get("ch-wait")["metadata"]["generation"] == 2
            else None
        ),
        20,
    )
    assert obj["status"]["conditions"][0]["observedGeneration"] == 2


def test_deleting_a_pchannel_releases_it_on_the_node(cluster: Cluster) -> None:
    node = cluster.add_node(1)
    cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-d", "ch-keep"))
    wait_for(lambda: cluster.ready("ch-d"), 30)
    wait_for(lambda: cluster.ready("ch-keep"), 30)
    assert {"ch-d", "ch-keep"} <= set(collect_status(node.address))
    assert not cluster.get("ch-d")["metadata"].get("finalizers")  # deletion never waits

    cluster.kubectl("delete", "pch", "ch-d", "--wait=true", "--timeout=30s")
    assert cluster.get("ch-d") is None
    wait_for(lambda: "ch-d" not in collect_status(node.address), 10, "ch-d released")
    assert "ch-keep" in collect_status(node.address)


def test_a_pchannel_deleted_while_the_operator_is_gone_is_released_by_the_next(
    cluster: Cluster,
) -> None:
    node = cluster.add_node(1)
    op = cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-orphan", "ch-keep"))
    wait_for(lambda: cluster.ready("ch-orphan"), 30)
    wait_for(lambda: cluster.ready("ch-keep"), 30)
    op.stop()

    cluster.kubectl("delete", "pch", "ch-orphan", "--wait=true", "--timeout=10s")
    assert cluster.get("ch-orphan") is None
    assert "ch-orphan" in collect_status(node.address)  # nobody told the node yet

    cluster.start_operator()  # the next operator fences what no PChannel owns any more
    wait_for(lambda: "ch-orphan" not in collect_status(node.address), 20, "orphan released")
    assert "ch-keep" in collect_status(node.address)


def test_removing_the_operator_leaves_nothing_blocking_namespace_deletion(
    cluster: Cluster,
) -> None:
    cluster.add_node(1)
    op = cluster.start_operator()
    # One PChannel as an older operator left it: with its finalizer, which this one drops.
    old = yaml.safe_load(pchannel_yaml("ch-old"))
    old["metadata"]["finalizers"] = [FINALIZER]
    cluster.kubectl(
        "apply", "-f", "-", stdin=pchannel_yaml("ch-new") + "---\n" + yaml.safe_dump(old)
    )
    for name in ("ch-new", "ch-old"):
        obj = wait_for(lambda n=name: cluster.ready(n), 30, f"{name} Ready")
    wait_for(lambda: not cluster.get("ch-old")["metadata"].get("finalizers"), 10, "finalizer gone")
    assert not obj["metadata"].get("finalizers")
    op.stop()  # helm uninstall: no operator any more

    cluster.kubectl("delete", "namespace", cluster.ns, "--wait=false")
    # The namespace controller (kube-controller-manager, absent from this control plane)
    # now deletes every object in the namespace and waits for each to go: none waits.
    cluster.kubectl("delete", "pch", "--all", "--wait=true", "--timeout=10s")
    assert cluster.co.list_namespaced_custom_object(G, V, cluster.ns, P)["items"] == []


def test_invalid_pchannel_is_rejected_with_a_clear_message(cluster: Cluster) -> None:
    cluster.start_operator()
    out = cluster.kubectl(
        "apply", "-f", "-", stdin=pchannel_yaml("ch-even", replicas=2), check=False
    )
    assert out.returncode != 0
    assert "replicas must be odd (1, 3, 5, 7 or 9) so that a majority quorum exists" in out.stderr
    assert cluster.get("ch-even") is None
    out = cluster.kubectl(
        "apply", "-f", "-", stdin=pchannel_yaml("ch-typo", retention={"age": "7 days"}), check=False
    )
    assert out.returncode != 0 and "spec.retention.age" in out.stderr
