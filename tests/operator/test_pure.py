"""The operator's pure pieces: status <-> record mapping, the Ready condition, pod -> node."""

from __future__ import annotations

from datetime import UTC, datetime

from streamwal.coord import state_machine as sm
from streamwal.operator import pods
from streamwal.operator import status as st


def obj(status: dict | None = None, generation: int = 3) -> dict:
    return {"metadata": {"name": "ch", "generation": generation}, "status": status or {}}


def test_new_pchannel_is_a_term_zero_record() -> None:
    record = st.record_from_object(obj())
    assert record.meta.channel.name == "ch" and record.meta.channel.term == 0
    assert record.meta.state == sm.UNINITIALIZED and not record.destroyed


def test_status_round_trips_through_the_record() -> None:
    meta = sm.begin_assignment(sm.new_channel("ch"), sm.NodeRef(1, "10.0.0.1:19530"))
    meta = sm.begin_assignment(meta, sm.NodeRef(2, "10.0.0.2:19530"))
    record = st.record_from_object(obj())
    record.meta.CopyFrom(meta)
    ready = st.ready_condition(record, None, live_nodes=2)
    status = st.status_patch(record, ready, obj())
    assert status["state"] == "Assigning" and status["term"] == 2
    assert status["histories"] == [{"term": 1, "node": {"id": 1, "address": "10.0.0.1:19530"}}]
    back = st.record_from_object(obj(status))
    assert back.meta == meta
    assert status["observedGeneration"] == 3 and status["conditions"][0]["observedGeneration"] == 3


def test_ready_condition_names_the_reason_for_every_outcome() -> None:
    record = st.record_from_object(obj())
    assert st.ready_condition(record, None, 0)["reason"] == "NoLiveNode"
    assert st.ready_condition(record, None, 2)["reason"] == "Pending"
    note = st.Note("AssignFailed", "assign to node 2 under term 3 failed: boom")
    failed = st.ready_condition(record, note, 2)
    assert failed["status"] == "False" and "boom" in failed["message"]
    record.meta.CopyFrom(
        sm.finish_assignment(sm.begin_assignment(record.meta, sm.NodeRef(2, "a:1")))
    )
    ok = st.ready_condition(record, note, 2)  # success wins over an old failure note
    assert ok["status"] == "True" and ok["reason"] == "Assigned" and "term 1" in ok["message"]


def test_a_single_copy_on_a_gone_node_waits_for_it_unless_data_loss_is_allowed() -> None:
    spec = {"replicas": 1, "failover": {"allowDataLoss": False}}
    record = st.record_from_object({**obj(), "spec": spec})
    assigned = sm.finish_assignment(sm.begin_assignment(record.meta, sm.NodeRef(2, "a:1")))
    record.meta.CopyFrom(sm.mark_unavailable(assigned))
    for live in (0, 2):  # whether or not another node could take it
        waiting = st.ready_condition(record, None, live)
        assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForReplica")
        assert "node 2" in waiting["message"]
    spec["failover"]["allowDataLoss"] = True
    allowed = st.record_from_object({**obj(), "spec": spec})
    assert allowed.allow_data_loss and not record.allow_data_loss
    allowed.meta.CopyFrom(record.meta)
    assert st.ready_condition(allowed, None, 2)["reason"] == "Unavailable"


def test_more_replicas_than_nodes_is_not_ready_and_says_why() -> None:
    record = st.record_from_object({**obj(), "spec": {"replicas": 5}})
    assert st.ready_condition(record, None, 2)["reason"] == "NotEnoughNodes"  # 2 < 3 needed
    assert st.ready_condition(record, None, 3)["reason"] == "Pending"  # a majority: placed
    record.meta.CopyFrom(
        sm.finish_assignment(sm.begin_assignment(record.meta, sm.NodeRef(1, "a:1")))
    )
    record.members.extend(sm.NodeRef(n, f"a:{n}").to_proto() for n in (1, 2, 3))
    short = st.ready_condition(record, None, 3)
    assert (short["status"], short["reason"]) == ("False", "NotEnoughNodes")
    assert "3 of spec.replicas 5" in short["message"] and "not 2" in short["message"]
    # enough nodes to grow: serving while the replicas are added, Ready only once they are
    growing = st.ready_condition(record, None, 5)
    assert (growing["status"], growing["reason"]) == ("False", "AddingReplicas")
    assert "3 of spec.replicas 5" in growing["message"]
    record.members.extend(sm.NodeRef(n, f"a:{n}").to_proto() for n in (4, 5))
    assert st.ready_condition(record, None, 5)["status"] == "True"
    assert st.ready_reason({"conditions": [short]}) == "NotEnoughNodes"


def test_transition_time_is_kept_while_the_condition_holds() -> None:
    record = st.record_from_object(obj())
    ready = st.ready_condition(record, None, 0)
    first = st.status_patch(record, ready, obj(), datetime(2030, 1, 1, tzinfo=UTC))
    again = st.status_patch(record, ready, obj(first), datetime(2031, 1, 1, tzinfo=UTC))
    assert again["conditions"][0]["lastTransitionTime"] == "2030-01-01T00:00:00Z"
    assert not st.status_differs(first, again)
    assert st.status_differs(first, st.status_patch(record, ready, obj(first, generation=4)))


def pod(
    name: str,
    ip: str | None,
    ready: bool,
    index: str | None = None,
    port: int = 19530,
    deleting: bool = False,
) -> dict:
    labels = {"apps.kubernetes.io/pod-index": index} if index is not None else {}
    meta = {"name": name, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "ports": [
                        {"name": "metrics", "containerPort": 9091},
                        {"name": "grpc", "containerPort": port},
                    ]
                }
            ]
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_nodes_are_ready_pods_with_ip_grpc_port_and_id() -> None:
    found = pods.nodes_from_pods(
        [
            pod("sw-node-0", "10.0.0.5", True, "0"),
            pod("sw-node-1", "10.0.0.6", False, "1"),  # not Ready
            pod("sw-node-2", None, True, "2"),  # no IP yet
            pod("sw-node-3", "10.0.0.8", True, None),  # id from the name's ordinal
            pod("sw-node-4", "10.0.0.9", True, "4", deleting=True),  # terminating
            pod("other", "10.0.0.10", True, None),  # no id at all
            pod("sw-node-5", "fd00::5", True, "5", port=1234),
        ]
    )
    # the terminating pod still serves: a node, drained so it hands over before it stops
    assert found == {
        0: "10.0.0.5:19530",
        3: "10.0.0.8:19530",
        4: "10.0.0.9:19530",
        5: "[fd00::5]:1234",
    }
    assert pods.draining(
        [pod("sw-node-4", "10.0.0.9", True, "4", deleting=True), pod("sw-node-0", "1.2.3.4", True)]
    ) == {4}


def test_replica_set_round_trips_and_spec_replicas_is_the_wanted_count() -> None:
    with_spec = {**obj(), "spec": {"replicas": 3}}
    record = st.record_from_object(with_spec)
    assert record.replicas == 3 and not record.members
    record.meta.CopyFrom(
        sm.finish_assignment(sm.begin_assignment(record.meta, sm.NodeRef(2, "b:1")))
    )
    record.members.extend(
        sm.NodeRef(n, f"{a}:1").to_proto() for n, a in ((1, "a"), (2, "b"), (4, "d"))
    )
    record.previous_members.extend(
        sm.NodeRef(n, f"{a}:1").to_proto() for n, a in ((1, "a"), (2, "b"), (3, "c"))
    )
    record.joint_until = 1234
    status = st.status_patch(record, st.ready_condition(record, None, 3), with_spec)
    assert [(r["id"], r["role"]) for r in status["replicas"]] == [
        (1, "Follower"),
        (2, "Leader"),
        (4, "Follower"),
    ]
    assert [r["id"] for r in status["previousReplicas"]] == [1, 2, 3]
    back = st.record_from_object({**with_spec, "status": status})
    assert back == record


def test_a_finished_replica_change_deletes_its_keys_in_the_merge_patch() -> None:
    """A merge patch leaves absent keys as stored: only null deletes them."""
    spec = {**obj(), "spec": {"replicas": 3}}
    record = st.record_from_object(spec)
    record.members.extend(sm.NodeRef(n, f"n{n}:1").to_proto() for n in (1, 2, 3))
    record.previous_members.append(sm.NodeRef(1, "n1:1").to_proto())
    record.joint_until = 77
    during = st.status_patch(record, st.ready_condition(record, None, 3), spec)
    assert during["jointUntil"] == 77 and len(during["previousReplicas"]) == 1
    del record.previous_members[:]
    record.joint_until = 0
    after = st.status_patch(record, st.ready_condition(record, None, 3), {**spec, "status": during})
    assert after["previousReplicas"] is None and after["jointUntil"] is None
    assert st.status_differs(during, after)
    unreplicated = st.record_from_object(obj())
    blank = st.status_patch(unreplicated, st.ready_condition(unreplicated, None, 0), obj())
    assert blank["node"] is None and blank["replicas"] is None


def test_placement_attrs_are_the_pods_labels_and_kubernetes_nodes() -> None:
    scheduled = pod("sw-node-1", "10.0.0.6", True, "1")
    scheduled["spec"]["nodeName"] = "worker-a"
    pending = pod("sw-node-2", "10.0.0.7", True, "2")
    labels, domains = pods.placement_attrs([scheduled, pending, pod("x-3", None, True, "3")])
    assert labels == {
        1: {"apps.kubernetes.io/pod-index": "1"},
        2: {"apps.kubernetes.io/pod-index": "2"},
    }
    assert domains == {1: "worker-a", 2: "pod sw-node-2"}  # no IP: not a node


def test_spec_placement_and_retention_reach_the_record_and_status() -> None:
    spec = {
        "replicas": 3,
        "retention": {"age": "7d", "size": "10GB"},
        "placement": {"nodeSelector": {"disk": "ssd"}, "antiAffinity": "Preferred"},
    }
    record = st.record_from_object({**obj(), "spec": spec})
    assert dict(record.node_selector) == {"disk": "ssd"} and record.anti_affinity == "Preferred"
    assert (record.retention.max_age_ms, record.retention.max_bytes) == (604_800_000, 10**10)
    assert not record.HasField("applied_retention")  # until the nodes took it
    record.applied_retention.CopyFrom(record.retention)
    status = st.status_patch(record, st.ready_condition(record, None, 3), obj())
    assert status["retention"] == {
        "age": "7d",
        "size": "10GB",
        "maxAgeMs": 604_800_000,
        "maxBytes": 10**10,
    }
    back = st.record_from_object({**obj(status), "spec": spec})
    assert back.applied_retention == record.retention
    defaults = st.record_from_object({**obj(), "spec": {}})  # the CRD's default age
    assert (defaults.retention.max_age_ms, defaults.retention.max_bytes) == (604_800_000, 0)
