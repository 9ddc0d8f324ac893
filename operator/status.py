"""PChannel status <-> the coord's ChannelRecord, and the Ready condition: pure, no I/O.

PChannel status is the operator's persisted meta. The mapping is lossless for what the
coord's state machine needs (state, term, node, histories, and for replicated pchannels
the replica set, the previous set of a pending change and its `jointUntil`; the wanted
count comes from `spec.replicas`).

Status is written as a JSON merge patch, where an absent key leaves the stored value alone
and only `null` deletes it: every optional key is therefore always written, as `null`
when the record has nothing for it. (A finished replica change once stayed "in progress"
for ever because `previousReplicas` was simply left out of the patch.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streamwal import units
from streamwal.coord.catch_up import WAITING_FOR_REPLICA
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

Obj = dict[str, Any]
DEFAULT_AGE = "168h"  # the CRD's default of spec.retention.age
NOT_ENOUGH_NODES = "NotEnoughNodes"
ADDING_REPLICAS = "AddingReplicas"
UNSCHEDULABLE = "Unschedulable"

S = pb.PChannelMetaState
STATE_NAMES = {
    S.PCHANNEL_META_STATE_UNINITIALIZED: "Pending",
    S.PCHANNEL_META_STATE_ASSIGNING: "Assigning",
    S.PCHANNEL_META_STATE_ASSIGNED: "Assigned",
    S.PCHANNEL_META_STATE_UNAVAILABLE: "Unavailable",
}
STATES = {v: k for k, v in STATE_NAMES.items()}


@dataclass(frozen=True)
class Note:
    """The latest failure the driver reported for a channel (shown in the Ready condition)."""

    reason: str
    message: str


def record_from_object(obj: Obj) -> cpb.ChannelRecord:
    """The coord's record of a PChannel object (no status yet: a new channel at term 0)."""
    status = obj.get("status") or {}
    state_name = status.get("state") or "Pending"
    record = cpb.ChannelRecord()
    meta = record.meta
    meta.channel.name = obj["metadata"]["name"]
    meta.channel.term = int(status.get("term") or 0)
    meta.state = STATES.get(state_name, S.PCHANNEL_META_STATE_UNINITIALIZED)
    node = status.get("node") or {}
    if node.get("address"):
        meta.node.server_id = int(node.get("id") or 0)
        meta.node.address = node["address"]
    for h in status.get("histories") or []:
        hn = h.get("node") or {}
        meta.histories.add(
            term=int(h.get("term") or 0),
            node=pb.StreamingNodeInfo(
                server_id=int(hn.get("id") or 0), address=hn.get("address", "")
            ),
        )
    record.owner.role = "kubernetes"
    spec = obj.get("spec") or {}
    record.replicas = int(spec.get("replicas") or 1)
    record.allow_data_loss = bool((spec.get("failover") or {}).get("allowDataLoss"))
    placement = spec.get("placement") or {}
    record.node_selector.update(placement.get("nodeSelector") or {})
    record.anti_affinity = placement.get("antiAffinity") or "Required"
    wanted = spec.get("retention") or {}
    record.retention.CopyFrom(
        pb.RetentionPolicy(
            max_age_ms=units.parse_duration_ms(wanted.get("age") or DEFAULT_AGE),
            max_bytes=units.parse_size(wanted.get("size") or units.UNLIMITED),
        )
    )
    applied = status.get("retention")
    if applied:
        record.applied_retention.CopyFrom(
            pb.RetentionPolicy(
                max_age_ms=int(applied.get("maxAgeMs") or 0),
                max_bytes=int(applied.get("maxBytes") or 0),
            )
        )
    record.members.extend(_nodes(status.get("replicas")))
    record.previous_members.extend(_nodes(status.get("previousReplicas")))
    record.joint_until = int(status.get("jointUntil") or 0)
    return record


def _nodes(items: list[Obj] | None) -> list[pb.StreamingNodeInfo]:
    return [
        pb.StreamingNodeInfo(server_id=int(r.get("id") or 0), address=r.get("address", ""))
        for r in items or []
    ]


def _replicas(record: cpb.ChannelRecord) -> list[Obj]:
    """status.replicas: every member, its role (the leader is the record's node)."""
    leader = record.meta.node.server_id
    return [
        {
            "id": m.server_id,
            "address": m.address,
            "role": "Leader" if m.server_id == leader else "Follower",
        }
        for m in record.members
    ]


def ready_condition(record: cpb.ChannelRecord, note: Note | None, live_nodes: int) -> Obj:
    """Ready with a reason and a message a user can act on, for every outcome."""
    meta = record.meta
    term, node = meta.channel.term, meta.node
    wanted = max(record.replicas, 1)
    if note is not None and note.reason == UNSCHEDULABLE:  # never a silent fallback
        return _cond("False", UNSCHEDULABLE, note.message)
    if meta.state == S.PCHANNEL_META_STATE_ASSIGNED:
        served = f"served by node {node.server_id} ({node.address}) under term {term}"
        have = len(record.members) or 1
        if have < wanted and live_nodes < wanted:
            return _cond(
                "False",
                NOT_ENOUGH_NODES,
                f"{served} on {have} of spec.replicas {wanted} nodes: {live_nodes} streaming "
                f"nodes answer, so it survives {(have - 1) // 2} node failures, not "
                f"{(wanted - 1) // 2}; the missing replicas are added when nodes appear",
            )
        if have < wanted:  # Ready promises the declared replicas, not fewer
            return _cond(
                "False",
                ADDING_REPLICAS,
                f"{served} on {have} of spec.replicas {wanted} nodes; {live_nodes} streaming "
                "nodes answer, the missing replicas are being added",
            )
        return _cond("True", "Assigned", served)
    if note is not None:
        return _cond("False", note.reason, note.message)
    if meta.state == S.PCHANNEL_META_STATE_ASSIGNING:
        return _cond(
            "False", "Assigning", f"term {term} persisted, assigning to node {node.server_id}"
        )
    if meta.state == S.PCHANNEL_META_STATE_UNAVAILABLE and (
        record.members or not record.allow_data_loss
    ):
        # Safe failover: only the gone node(s) hold what was acknowledged.
        what = "a majority of its replicas" if record.members else f"node {node.server_id}"
        return _cond(
            "False",
            WAITING_FOR_REPLICA,
            f"waiting for {what} to return with the log (only they hold every acknowledged "
            "message; spec.failover.allowDataLoss would move a single copy without them)",
        )
    if live_nodes == 0:
        return _cond("False", "NoLiveNode", "no Ready streaming-node pod answers its probes")
    if meta.state == S.PCHANNEL_META_STATE_UNINITIALIZED and live_nodes < wanted // 2 + 1:
        return _cond(
            "False",
            NOT_ENOUGH_NODES,
            f"spec.replicas {wanted} needs a majority ({wanted // 2 + 1}) of live streaming "
            f"nodes to be placed; {live_nodes} answer",
        )
    if meta.state == S.PCHANNEL_META_STATE_UNAVAILABLE:
        return _cond("False", "Unavailable", f"node {node.server_id} lost; waiting for a node")
    return _cond("False", "Pending", "waiting for the operator to place it")


def ready_reason(status: Obj | None) -> str:
    """The Ready condition's reason in a PChannel status ("" when none)."""
    conditions = (status or {}).get("conditions") or []
    return next((c.get("reason", "") for c in conditions if c.get("type") == "Ready"), "")


def _cond(status: str, reason: str, message: str) -> Obj:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


def status_patch(
    record: cpb.ChannelRecord, ready: Obj, obj: Obj, now: datetime | None = None
) -> Obj:
    """The full status the operator writes for `record` over the current object `obj`.

    `lastTransitionTime` is kept while the condition's status does not change; every write
    carries the object's generation as `observedGeneration`; keys the record has no value
    for are `None` (`null` deletes them in a merge patch).
    """
    meta = record.meta
    old = obj.get("status") or {}
    generation = int(obj["metadata"].get("generation") or 1)
    previous = next((c for c in old.get("conditions") or [] if c.get("type") == "Ready"), None)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if (
        previous
        and previous.get("status") == ready["status"]
        and previous.get("lastTransitionTime")
    ):
        stamp = previous["lastTransitionTime"]
    condition = {**ready, "lastTransitionTime": stamp, "observedGeneration": generation}
    state = STATE_NAMES.get(meta.state, "Pending")
    status: Obj = {
        "state": state,
        "term": meta.channel.term,
        "node": (
            {"id": meta.node.server_id, "address": meta.node.address} if meta.node.address else None
        ),
        "histories": [
            {"term": h.term, "node": {"id": h.node.server_id, "address": h.node.address}}
            for h in meta.histories
        ],
        "conditions": [condition],
        "observedGeneration": generation,
        "replicas": _replicas(record) or None,
        "previousReplicas": [
            {"id": m.server_id, "address": m.address} for m in record.previous_members
        ]
        or None,
        "jointUntil": record.joint_until if record.previous_members else None,
        "retention": _retention(record.applied_retention)
        if record.HasField("applied_retention")
        else None,
    }
    return status


def _retention(policy: pb.RetentionPolicy) -> Obj:
    return {
        "age": units.format_duration_ms(policy.max_age_ms),
        "size": units.format_size(policy.max_bytes),
        "maxAgeMs": policy.max_age_ms,
        "maxBytes": policy.max_bytes,
    }


def status_differs(current: Obj, desired: Obj) -> bool:
    """Whether writing `desired` would change anything a user or the operator reads."""
    cur = dict(current or {})
    want = dict(desired)
    for s in (cur, want):
        s.pop("conditions", None)
        for key in ("node", "histories", "replicas", "previousReplicas", "jointUntil", "retention"):
            if not s.get(key):
                s.pop(key, None)
    if cur != want:
        return True
    c = next((c for c in (current or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    d = desired["conditions"][0]
    return any(c.get(k) != d.get(k) for k in ("status", "reason", "message", "observedGeneration"))
