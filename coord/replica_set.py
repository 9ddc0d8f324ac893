"""Which nodes hold a replicated pchannel, and what its replica set needs next: pure, no I/O.

A replicated pchannel has a set of `members` (distinct nodes, leader included) under each
term. Every change of leader or of members is a *term change* (persist the new term, fence,
choose the leader, assign: see `coordinator` and `leader_choice`); a member that is merely
back from a restart rejoins as a follower under the current term.

Placement spreads replicas like the balancer spreads owners: least loaded eligible (live,
not drained) node first, ties on the lowest id, where load counts every replica a node
holds. A member whose node is lost (past the grace period) or drained is replaced by an
eligible node outside the set -- only when there is one: a set never shrinks on its own,
so a node that returns still finds its place.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from streamwal.coord import state_machine as sm
from streamwal.coord.balancer import eligible
from streamwal.coord.leader_choice import has_quorum, majority
from streamwal.proto import coord_pb2 as cpb


def replica_loads(sets: Mapping[str, Collection[int]], nodes: Iterable[int]) -> dict[int, int]:
    """Replicas per node over all pchannels' sets, 0 for every node in `nodes`."""
    out = dict.fromkeys(nodes, 0)
    for members in sets.values():
        for node in members:
            out[node] = out.get(node, 0) + 1
    return out


@dataclass(frozen=True)
class Spread:
    """Anti-affinity between a pchannel's replicas: `domains` maps a node to its topology
    domain (nodes without one are each their own); `required` refuses a second replica
    in a domain, else one is taken only when no fresh domain is left (Preferred)."""

    domains: Mapping[int, str]
    required: bool = True

    def domain(self, node: int) -> str:
        return self.domains.get(node) or f"node {node}"


def place(
    count: int,
    loads: Mapping[int, int],
    live: Iterable[int],
    drained: Iterable[int],
    exclude: Collection[int] = (),
    spread: Spread | None = None,
    keep: Collection[int] = (),
) -> list[int]:
    """Up to `count` distinct eligible nodes outside `exclude`, least loaded first, in
    domains none of `keep` (the members staying) is in when `spread` says so."""
    candidates = [n for n in eligible(live, drained) if n not in set(exclude)]
    ranked = sorted(candidates, key=lambda n: (loads.get(n, 0), n))
    if spread is None:
        return ranked[: max(count, 0)]
    used = {spread.domain(n) for n in keep}
    out, skipped = [], []
    for node in ranked:
        if spread.domain(node) in used:
            skipped.append(node)
            continue
        out.append(node)
        used.add(spread.domain(node))
    if not spread.required:
        out += skipped
    return out[: max(count, 0)]


def desired_members(
    members: Sequence[int],
    wanted: int,
    alive: Collection[int],
    live: Collection[int],
    drained: Collection[int],
    loads: Mapping[int, int],
    leader: int | None = None,
    spread: Spread | None = None,
) -> list[int]:
    """The set to have: shrunk to `wanted`, lost or drained members replaced in place,
    then filled to `wanted`.

    A shrink removes followers only, the gone ones first, then drained ones, then the
    last added: the leader holds the newest records. A member is replaced only by an
    eligible non-member; without one it stays (a lost node may come back, a drained one
    still holds data). An alive `leader` is never replaced: it may hold the only copy of
    the newest records, so it first hands over (see `next_step`) and is replaced as a
    follower. The order of kept members is kept (a member's ordinal is its index).
    """
    out = list(members)
    if len(out) > max(wanted, 1):
        ranked = sorted(
            (n for n in out if n != leader),
            key=lambda n: (n in set(alive), n not in set(drained), -out.index(n)),
        )
        drop = set(ranked[: len(out) - max(wanted, 1)])
        out = [n for n in out if n not in drop]
    gone = [
        i for i, n in enumerate(out) if n not in set(alive) or (n in set(drained) and n != leader)
    ]
    kept = [n for i, n in enumerate(out) if i not in set(gone)]
    count = len(gone) + max(wanted - len(out), 0)
    # (no ranking when nothing is to be placed: most sets are whole, every round)
    spare = (
        place(count, loads, live, drained, exclude=out, spread=spread, keep=kept) if count else []
    )
    for i in gone:
        if not spare:
            break
        out[i] = spare.pop(0)
    while len(out) < wanted and spare:
        out.append(spare.pop(0))
    return out


@dataclass(frozen=True)
class TermChange:
    """Run a term change: fence, choose a leader among `members`, assign them all."""

    reason: str  # placement, failover, resume, reconfigure
    members: tuple[int, ...]


@dataclass(frozen=True)
class Rejoin:
    """Assign these members (back) as followers under the current term."""

    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing can be done now; `reason` says why (the caller reports it)."""

    reason: str


Step = TermChange | Rejoin | Wait | None


@dataclass(frozen=True)
class ChannelView:
    """What the coord knows of one replicated pchannel in a reconcile round."""

    assigned: bool  # ASSIGNED (else never placed, half-assigned or unavailable)
    placed: bool  # has members (else never placed)
    leader: int | None
    members: tuple[int, ...]
    previous: tuple[int, ...]  # the joint set while a change is pending, else empty
    wanted: int
    missing: frozenset[int]  # members probed since the assignment that do not serve it
    caught_up: frozenset[int] = frozenset()  # followers the leader reports at its log end


def next_step(
    view: ChannelView,
    alive: Collection[int],
    live: Collection[int],
    drained: Collection[int],
    loads: Mapping[int, int],
    spread: Spread | None = None,
) -> Step:
    """The one thing a replicated pchannel needs this round (None: nothing). `drained`
    includes the nodes the pchannel's placement excludes (replaced like drained ones)."""
    if not view.placed:
        first = desired_members((), view.wanted, alive, live, drained, loads, spread=spread)
        if len(first) < majority(view.wanted):
            return Wait(f"needs {majority(view.wanted)} live nodes, has {len(first)}")
        return TermChange("placement", tuple(first))
    voters = [view.members, view.previous]
    if not has_quorum(set(alive), voters):
        return Wait("no majority of its replicas is alive")
    # A second change of members waits until the pending one is complete (joint quorum).
    target = (
        list(view.members)
        if view.previous
        else desired_members(
            view.members, view.wanted, alive, live, drained, loads, view.leader, spread
        )
    )
    if not view.assigned:
        return TermChange("resume", tuple(target))
    if view.leader not in set(alive) or view.leader in view.missing:
        return TermChange("failover", tuple(target))
    if tuple(target) != view.members:
        return TermChange("reconfigure", tuple(target))
    if view.leader in set(drained) and view.caught_up - set(drained):
        # A drained leader hands over to a follower that holds its whole log (the choice
        # prefers non-drained nodes among the most complete logs).
        return TermChange("handover", tuple(target))
    back = tuple(n for n in view.members if n in view.missing and n in set(live))
    return Rejoin(back) if back else None


def leader_down(view: ChannelView, alive: Collection[int], down: Collection[int]) -> bool:
    """Whether the leader's node is known dead (liveness: both its ports refuse) while a
    majority of every voting set is up without it: its failover need not wait the grace.
    Such a failover is clean -- the term change fences a majority and the leader chosen
    among it holds every committed record -- and the node stays a member (a restarted
    node rejoins as a follower). Without such a majority the grace still decides."""
    if view.leader is None or view.leader not in set(down) or not view.assigned:
        return False
    up = set(alive) - set(down)
    return has_quorum(up, [view.members, view.previous])


def readmit(members: Sequence[int], leader: int, stable: Collection[int]) -> tuple[int, ...] | None:
    """The new set with `leader` (a voter the change was replacing, holding the most
    complete log) back in place of a member being added (one not in the `stable` set the
    change started from): the last such one. None when no member is being added."""
    if leader in members:
        return tuple(members)
    added = [i for i, n in enumerate(members) if n not in set(stable)]
    if not added:
        return None
    out = list(members)
    out[added[-1]] = leader
    return tuple(out)


def joint_complete(
    members: Collection[int], leader: int, joint_until: int, acked: Mapping[int, int]
) -> bool:
    """Whether every member now holds the log up to `joint_until` (the previous set can go).

    `acked`: each follower's acked offset as its leader reports it; the leader itself held
    the log's end when it was chosen.
    """
    return all(n == leader or acked.get(n, -1) >= joint_until for n in members)


def current_members(record: cpb.ChannelRecord) -> tuple[int, ...]:
    """The nodes holding the log now: the replica set, or a single-replica pchannel's
    owner (so that growing 1 -> 3 keeps the node with the log in the set and the vote)."""
    if record.members:
        return member_ids(record)
    meta = record.meta
    if meta.state == sm.ASSIGNING and meta.histories:  # a move under way: its source
        return (meta.histories[0].node.server_id,)
    if meta.node.address and meta.state in (sm.ASSIGNED, sm.UNAVAILABLE):
        return (meta.node.server_id,)
    return ()


def is_replicated(record: cpb.ChannelRecord) -> bool:
    """Replicated pchannels change terms as a set; the others move one owner at a time."""
    return record.replicas > 1 or len(record.members) > 0


def held_by(record: cpb.ChannelRecord) -> frozenset[int]:
    """The nodes a live record names: its owner and its replica set (a node's report
    can only be stale or missing something about these, `planner.needs_action`)."""
    if record.destroyed:
        return frozenset()
    owner = record.meta.node.server_id
    return frozenset(member_ids(record)) | ({owner} if record.meta.HasField("node") else set())


def member_ids(record: cpb.ChannelRecord) -> tuple[int, ...]:
    return tuple(m.server_id for m in record.members)
