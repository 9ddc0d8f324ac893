"""The pchannel state machine: pure transitions on the seed's PChannelMeta, no I/O.

A (re)assignment is a fixed sequence of steps that a driver executes one by one:

1. ``persist ASSIGNING``: term + 1, the new node, and the previous (term, node) pushed into
   ``histories`` -- written to the meta store *before* anyone is told anything;
2. ``Remove(name, old term)`` on every node in ``histories`` (best effort, bounded wait);
3. ``Assign(name, new term)`` on the new node;
4. ``persist ASSIGNED`` with ``histories`` cleared.

Because the meta is persisted before every action and every action is idempotent on the
nodes (same-term Assign succeeds again, Remove of an older term or of an unknown channel is
harmless), a coord that crashes anywhere resumes by asking `next_actions(meta)` what is left:
an ASSIGNING meta replays steps 2-4. Terms only ever grow: the only way to a new term is
`begin_assignment`, which adds one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from streamwal.proto import streaming_pb2 as pb

State = pb.PChannelMetaState
UNINITIALIZED = State.PCHANNEL_META_STATE_UNINITIALIZED
ASSIGNING = State.PCHANNEL_META_STATE_ASSIGNING
ASSIGNED = State.PCHANNEL_META_STATE_ASSIGNED
UNAVAILABLE = State.PCHANNEL_META_STATE_UNAVAILABLE


class Step(StrEnum):
    """The named steps of the coord's sagas (coord/sagas.py): a reassignment is
    persist-assigning, remove, assign, persist-assigned; a replicated term change is
    persist-assigning, fence, assign (the leader), assign-followers, persist-assigned.
    Step hooks (crash injection in tests and the simulator) and logs use these names."""

    PERSIST_ASSIGNING = "persist-assigning"
    REMOVE = "remove"
    FENCE = "fence"
    ASSIGN = "assign"
    ASSIGN_FOLLOWERS = "assign-followers"
    PERSIST_ASSIGNED = "persist-assigned"
    PERSIST_UNAVAILABLE = "persist-unavailable"
    PERSIST_JOINT_DONE = "persist-joint-done"
    PERSIST_RETENTION = "persist-retention"


class InvalidTransition(ValueError):
    """A transition that would break an invariant (for example a term going backwards)."""


@dataclass(frozen=True)
class NodeRef:
    """A streaming node as the coord knows it: id and gRPC address."""

    server_id: int
    address: str

    def to_proto(self) -> pb.StreamingNodeInfo:
        return pb.StreamingNodeInfo(server_id=self.server_id, address=self.address)

    @staticmethod
    def from_proto(info: pb.StreamingNodeInfo) -> NodeRef:
        return NodeRef(info.server_id, info.address)


def node_ref(
    nodes: Mapping[int, str], node: int, members: Iterable[pb.StreamingNodeInfo] = ()
) -> NodeRef:
    """A node by id: its address from the node set, else as `members` (a replicated
    pchannel's record) name it; "" when neither knows it."""
    address = nodes.get(node)
    if address is None:
        address = next((m.address for m in members if m.server_id == node), "")
    return NodeRef(node, address)


@dataclass(frozen=True)
class RemoveOld:
    """Step 2: tell a previous owner to stop serving `name` at `term` (best effort)."""

    node: NodeRef
    name: str
    term: int
    step: Step = Step.REMOVE


@dataclass(frozen=True)
class AssignNew:
    """Step 3: make `node` the owner of `name` under `term` (must succeed)."""

    node: NodeRef
    name: str
    term: int
    step: Step = Step.ASSIGN


@dataclass(frozen=True)
class PersistAssigned:
    """Step 4: write `meta` (ASSIGNED, histories cleared) to the meta store."""

    meta: pb.PChannelMeta
    step: Step = Step.PERSIST_ASSIGNED


Action = RemoveOld | AssignNew | PersistAssigned


def new_channel(name: str) -> pb.PChannelMeta:
    """The meta of a freshly created pchannel: never assigned, term 0."""
    return pb.PChannelMeta(channel=pb.PChannelInfo(name=name, term=0), state=UNINITIALIZED)


def owner(meta: pb.PChannelMeta) -> NodeRef | None:
    """The node named by the meta (the current or intended owner), None if never assigned."""
    if meta.state == UNINITIALIZED or not meta.HasField("node"):
        return None
    return NodeRef.from_proto(meta.node)


def begin_assignment(
    meta: pb.PChannelMeta, target: NodeRef, reuse_term: bool = False, seen_term: int = 0
) -> pb.PChannelMeta:
    """Step 1: a new meta in ASSIGNING with term + 1 on `target`.

    Whatever node the meta named before (assigned, half-assigned or unavailable) may hold
    the channel under the old term, so it goes into `histories` to be removed.
    `reuse_term`: keep the term (an ASSIGNING meta whose term had no leader, see
    sagas.term_change): the meta is only pointed at `target`.

    `seen_term`, the highest term any node reported for the pchannel, is a floor: above
    the record's term only if the meta store lost writes it had acknowledged (a damaged
    journal tail), and then a term some node already holds is never handed out again,
    nor reused.
    """
    out = pb.PChannelMeta()
    out.CopyFrom(meta)
    if reuse_term and seen_term <= meta.channel.term:
        out.node.CopyFrom(target.to_proto())
        return out
    previous = owner(meta)
    if previous is not None:
        _push_history(out, meta.channel.term, previous)
    out.channel.term = max(meta.channel.term, seen_term) + 1
    out.node.CopyFrom(target.to_proto())
    out.state = ASSIGNING
    return out


def finish_assignment(meta: pb.PChannelMeta) -> pb.PChannelMeta:
    """Step 4's meta: ASSIGNED at the same term, histories cleared."""
    if meta.state != ASSIGNING:
        raise InvalidTransition(f"{meta.channel.name}: finish from {State.Name(meta.state)}")
    out = pb.PChannelMeta()
    out.CopyFrom(meta)
    out.state = ASSIGNED
    del out.histories[:]
    return out


def mark_unavailable(meta: pb.PChannelMeta) -> pb.PChannelMeta:
    """Its node is lost and no live node can take it: UNAVAILABLE, term and node kept.

    The lost node stays in `node`, so the next `begin_assignment` fences it via histories.
    """
    if meta.state not in (ASSIGNED, ASSIGNING):
        raise InvalidTransition(f"{meta.channel.name}: unavailable from {State.Name(meta.state)}")
    out = pb.PChannelMeta()
    out.CopyFrom(meta)
    out.state = UNAVAILABLE
    return out


def next_actions(meta: pb.PChannelMeta) -> list[Action]:
    """Steps 2-4 still to run for a persisted meta; empty unless it is ASSIGNING.

    This is the whole recovery story: on restart the driver calls it for every pchannel and
    runs what it returns, whatever step the previous incarnation died at.
    """
    if meta.state != ASSIGNING:
        return []
    name, target = meta.channel.name, NodeRef.from_proto(meta.node)
    actions: list[Action] = [
        RemoveOld(NodeRef.from_proto(h.node), name, h.term)
        for h in meta.histories
        # Removing the target itself at an older term is pointless: the new Assign fences it.
        if h.node.server_id != target.server_id
    ]
    actions.append(AssignNew(target, name, meta.channel.term))
    actions.append(PersistAssigned(finish_assignment(meta)))
    return actions


def needs_assignment(meta: pb.PChannelMeta, alive: Iterable[int]) -> bool:
    """True when the pchannel must get a (new) owner now.

    Never assigned, unavailable, or its owner is not `alive` (not yet declared lost):
    failover. A drained owner is handled by the balancer at its own pace, not here.
    """
    if meta.state in (UNINITIALIZED, UNAVAILABLE):
        return True
    node = owner(meta)
    return node is None or node.server_id not in set(alive)


def _push_history(meta: pb.PChannelMeta, term: int, node: NodeRef) -> None:
    for h in meta.histories:
        if h.term == term and h.node.server_id == node.server_id:
            return
    meta.histories.add(term=term, node=node.to_proto())


def stale_channels(
    node_id: int,
    served: Iterable[pb.PChannelInfo],
    metas: Mapping[str, pb.PChannelMeta],
    members: Mapping[str, Collection[int]] | None = None,
) -> list[pb.PChannelInfo]:
    """Channels a node serves that it must not: unknown, another owner, or an older term.

    A node that comes back after a failover still believes in its old terms; the coord never
    trusts that and removes them (the node's term check fences them as well). For a
    replicated pchannel (`members`: its replica set) every member may serve it (lead or
    follow) at the current term.
    """
    out = []
    for info in served:
        meta = metas.get(info.name)
        if meta is None:
            out.append(info)
            continue
        current = owner(meta)
        holders = (members or {}).get(info.name) or ({current.server_id} if current else set())
        if node_id not in holders or info.term < meta.channel.term:
            out.append(info)
    return out


def missing_channels(
    node_id: int, served: Iterable[pb.PChannelInfo], metas: Mapping[str, pb.PChannelMeta]
) -> list[str]:
    """ASSIGNED channels of `node_id` that the node does not report at their term."""
    have = {(i.name, i.term) for i in served}
    return sorted(
        name
        for name, meta in metas.items()
        if meta.state == ASSIGNED
        and meta.node.server_id == node_id
        and (name, meta.channel.term) not in have
    )
