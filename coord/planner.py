"""What one reconcile round does: `plan(snapshot, observations, now) -> Plan`. Pure, no I/O.

A round looks at every pchannel once and gives each at most one job:

- single-replica pchannels (`state_machine`, `balancer`): resume a half-done move whose
  target is alive, place new ones, fail over those whose owner is not alive, re-assign
  those whose live owner does not serve them (probed after the assignment, or reported
  by a client and confirmed), and mark UNAVAILABLE what no live node can take;
- replicated pchannels (`replica_set.next_step`): a term change (placement, failover,
  replacement of a lost or drained member, handover, resume), followers that rejoin,
  the end of a joint quorum, or UNAVAILABLE when no majority is alive;
- then every (pchannel, term) a node serves without owning it at that term is removed;
- then, when due, at most `max_moves` single-replica pchannels move to even the load.

The jobs run in those three waves (`Plan.waves`) by the executor, which re-checks under
the pchannel's lock that the record is still the version planned from: a record changed
since (another writer, a user's destroy) skips the job, and the next round decides again.
Each job is a saga of steps (`sagas`); nothing here waits, reads a clock or calls a node.

A round may be limited to the pchannels that changed (`plan(..., dirty=names)`): those
whose record, owner's or members' liveness, or node reports changed since the last round
(the coordinator collects them), plus those the last round left unsettled
(`Plan.unsettled`: a job, or not at rest). A pchannel at rest with nothing new about it
gets no job in a full round either, so the per-pchannel work follows what changed, not
the cluster (issue 24: a full round over 10,000 records took 2.2 s of CPU). What every
pchannel shares (loads, leaders) is still counted over all records, cheaply.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from streamwal.coord import balancer, catch_up
from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.coord.memory import Memory, NodeReport
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.coord.meta_store import Stored  # (the store itself does I/O)

LEADER = pb.ReplicaRole.REPLICA_ROLE_LEADER
FOLLOWER = pb.ReplicaRole.REPLICA_ROLE_FOLLOWER


# ----------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Snapshot:
    """What the coord holds: records (with versions), the node set and its memory."""

    records: Mapping[str, Stored]  # every record, destroyed ones included
    nodes: Mapping[int, str]  # node id -> address
    drained: frozenset[int]
    memory: Memory  # read, never written, by the planner
    rebalance_due: bool = False
    max_moves: int = 1
    tolerance: int = 1
    grace: float = 0.0  # how long an unclean failover waits for a holder out of the node set
    labels: Mapping[int, Mapping[str, str]] = field(default_factory=dict)  # node -> labels
    domains: Mapping[int, str] = field(default_factory=dict)  # node -> topology domain
    # node -> the live pchannels whose records name it (ChannelRecords.held); None: found
    # from `records` (a walk over all of them)
    held: Mapping[int, AbstractSet[str]] | None = None
    # node selector -> (allowed, unfit) nodes: filled as a round asks (`_fit`)
    fit: dict[tuple[tuple[str, str], ...], tuple[frozenset[int], frozenset[int]]] = field(
        default_factory=dict, compare=False, repr=False
    )


@dataclass(frozen=True)
class Observations:
    """What probes and clients told: liveness, and confirmed client reports."""

    alive: frozenset[int]  # not (yet) declared lost
    live: frozenset[int]  # answered recently: may get new pchannels
    lost: frozenset[int] = frozenset()  # declared lost (past the grace period)
    rechecked: frozenset[str] = frozenset()  # reported by clients, not served by the owner
    down: frozenset[int] = frozenset()  # known dead (liveness.LivenessTracker.down)


# ----------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Reassign:
    """Move a single-replica pchannel to `target` (None: finish the persisted move)."""

    name: str
    version: str
    target: sm.NodeRef | None
    reason: str  # placement, failover, resume, recheck, rebalance, accept-data-loss
    accept_data_loss: bool = False  # the holder of a lost log may serve it again


@dataclass(frozen=True)
class MarkUnavailable:
    """Nothing can take the pchannel now: persist UNAVAILABLE and say why."""

    name: str
    version: str
    node: int | None
    reason: str = ""
    code: str = ""  # a machine-readable reason (catch_up.WAITING_FOR_REPLICA), if any


@dataclass(frozen=True)
class ChangeTerm:
    """Run a replicated term change onto `members` (sagas.term_change)."""

    name: str
    version: str
    members: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Rejoin:
    """Assign these members (back) as followers under the current term."""

    name: str
    version: str
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class CompleteJoint:
    """Every member holds the log up to the change point: drop the previous set."""

    name: str
    version: str


@dataclass(frozen=True)
class ApplyRetention:
    """Give the members the record's retention under the current term (spec changed)."""

    name: str
    version: str


@dataclass(frozen=True)
class Unschedulable:
    """The pchannel's placement excludes every node it could use (`reason`), or no longer
    does (""): tell the user; nothing is persisted."""

    name: str
    version: str
    reason: str


@dataclass(frozen=True)
class RemoveStale:
    """Remove a (pchannel, term) a node serves without owning it (best effort)."""

    node: sm.NodeRef
    name: str
    term: int


Job = (
    Reassign
    | MarkUnavailable
    | ChangeTerm
    | Rejoin
    | CompleteJoint
    | ApplyRetention
    | Unschedulable
    | RemoveStale
)


@dataclass(frozen=True)
class Plan:
    assign: tuple[Job, ...] = ()  # wave 1: every pchannel's own job
    fence: tuple[RemoveStale, ...] = ()  # wave 2
    rebalance: tuple[Reassign, ...] = ()  # wave 3
    # Pchannels led per node when the round began; the round's term changes count their
    # choices into a copy, so that pchannels placed together get different leaders.
    leaders: Mapping[int, int] = field(default_factory=dict)
    rebalanced: bool = False  # the round consumed a due rebalance
    # Pchannels planned this round that the next one must look at again even if nothing
    # about them changes: those given a job (it may fail without persisting anything)
    # and those not at rest (`at_rest`).
    unsettled: frozenset[str] = frozenset()

    @property
    def waves(self) -> tuple[tuple[Job, ...], ...]:
        return (self.assign, self.fence, self.rebalance)

    def __len__(self) -> int:
        return len(self.assign) + len(self.fence) + len(self.rebalance)


# ----------------------------------------------------------------- the round


def plan(
    snapshot: Snapshot,
    seen: Observations,
    now: float,
    dirty: AbstractSet[str] | None = None,
) -> Plan:
    """Every job of one round (see the module docstring); `dirty`: plan only these
    pchannels (None: all of them)."""
    alive = seen.alive & set(snapshot.nodes)
    records = snapshot.records
    metas = {n: s.record.meta for n, s in records.items() if not s.record.destroyed}
    if dirty is None:
        scope: Mapping[str, Stored] = records
    else:
        scope = {n: records[n] for n in sorted(dirty) if n in records}
    live_records = {n: s for n, s in scope.items() if not s.record.destroyed}
    replicated = {n: s for n, s in live_records.items() if rs.is_replicated(s.record)}
    single = {
        n: s
        for n, s in live_records.items()
        if n not in replicated and n not in snapshot.memory.data_loss
    }

    jobs, targets = _single(snapshot, seen, alive, single, metas, now)
    leaders = leader_counts(metas.values())
    jobs.extend(_replicated(snapshot, seen, alive, replicated, now))
    jobs.extend(_unschedulable(snapshot, seen, live_records))
    busy = {j.name for j in jobs if not isinstance(j, RemoveStale | Unschedulable)}
    jobs.extend(
        ApplyRetention(n, s.version)
        for n, s in sorted(live_records.items())
        if n not in busy and retention_due(s.record)
    )
    # All of `dirty`, not only the recorded ones: a pchannel a node serves that has no
    # record any more (a PChannel deleted in Kubernetes leaves the view) is stale there.
    fence = tuple(remove_stale(snapshot, metas, None if dirty is None else set(dirty)))
    rebalance: tuple[Reassign, ...] = ()
    if snapshot.rebalance_due:
        rebalance = tuple(_rebalance(snapshot, seen, single, targets))
    unsettled = {j.name for j in jobs if not isinstance(j, Unschedulable)}
    unsettled.update(j.name for j in rebalance)
    unsettled.update(
        n
        for n, s in live_records.items()
        if n not in snapshot.memory.data_loss and not at_rest(s.record, snapshot, seen)
    )
    return Plan(
        tuple(jobs), fence, rebalance, leaders, snapshot.rebalance_due, frozenset(unsettled)
    )


def at_rest(record: cpb.ChannelRecord, snapshot: Snapshot, seen: Observations) -> bool:
    """Whether a live pchannel needs nothing until something about it changes: ASSIGNED,
    no joint set or retention pending, its owner (and every member) live, not drained
    and fit for it, its replica set full. Anything else is planned again each round
    (it waits for a node, a report, a handover, a joint quorum's end)."""
    meta = record.meta
    if meta.state != sm.ASSIGNED or record.previous_members or retention_due(record):
        return False
    avoided = snapshot.drained | unfit(record, snapshot)
    holders = rs.member_ids(record) or (meta.node.server_id,)
    if len(holders) < max(record.replicas, 1):
        return False
    return all(n in seen.live and n in snapshot.nodes and n not in avoided for n in holders)


def _single(
    snapshot: Snapshot,
    seen: Observations,
    alive: Collection[int],
    single: Mapping[str, Stored],
    metas: Mapping[str, pb.PChannelMeta],
    now: float,
) -> tuple[list[Job], dict[str, int | None]]:
    """Single-replica pchannels' jobs, and where each one that has a job will be."""
    memory = snapshot.memory
    single_metas = {n: s.record.meta for n, s in single.items()}
    forced = {n for n in seen.rechecked if n in single} | missing_single(
        single_metas, memory.reports, memory.assigned_at
    )
    jobs: list[Job] = []
    targets: dict[str, int | None] = {}
    need: dict[str, str] = {}
    for name, stored in single.items():
        meta = stored.record.meta
        owner = sm.owner(meta)
        owner_alive = owner is not None and owner.server_id in alive
        if name in forced:
            need[name] = "recheck"
        elif meta.state == sm.ASSIGNING and owner_alive and name not in memory.failed_target:
            jobs.append(Reassign(name, stored.version, None, "resume"))
            targets[name] = meta.node.server_id
        elif meta.state == sm.ASSIGNING or sm.needs_assignment(meta, alive):
            need[name] = "placement" if meta.state == sm.UNINITIALIZED else "failover"
        elif (
            meta.state == sm.ASSIGNED
            and owner is not None
            and owner_alive
            and owner.server_id in unfit(stored.record, snapshot)
            and allowed(stored.record, snapshot) & seen.live
        ):
            # Its placement (spec changed) excludes its node: it moves, with its log.
            need[name] = "placement"

    load = balancer.loads(
        {
            n: m.node.server_id
            for n, m in metas.items()
            if n not in need
            and m.state in (sm.ASSIGNED, sm.ASSIGNING)
            and m.node.server_id in alive
        },
        (),
    )
    for name in sorted(need):
        stored = single[name]
        meta = stored.record.meta
        holder = catch_up.data_holder(meta, memory.holders.get(name))
        why = _hold(snapshot, seen, stored.record, holder, now)
        if why:
            # Its records are on a gone node: wait for it. Only an ASSIGNED record is
            # marked (a half-done move keeps its holder in `histories`, which UNAVAILABLE
            # would not say); the Ready condition tells the user why.
            if meta.state == sm.ASSIGNED and holder is not None:
                waiting = catch_up.WAITING_FOR_REPLICA
                if stored.record.allow_data_loss:
                    waiting = ""
                jobs.append(MarkUnavailable(name, stored.version, holder.server_id, why, waiting))
            targets[name] = None
            continue
        failed = memory.failed_target.get(name)
        if (
            need[name] == "failover"
            and holder is not None
            and not _gone(snapshot, seen, holder.server_id)
            and holder.server_id not in snapshot.drained
            and holder.server_id != failed
        ):
            if holder.server_id not in seen.live:
                targets[name] = None  # back in the node set, not probed yet: next round
                continue
            # The holder is back: it serves its own log again, nothing to copy.
            load[holder.server_id] = load.get(holder.server_id, 0) + 1
            targets[name] = holder.server_id
            jobs.append(
                Reassign(name, stored.version, _ref(snapshot, holder.server_id), "failover")
            )
            continue
        candidates = seen.live - {failed} if seen.live - {failed} else seen.live
        avoided = snapshot.drained | unfit(stored.record, snapshot)
        chosen = balancer.least_loaded(load, candidates, avoided)
        if chosen is None:
            # Nowhere to go now; the pchannel waits (and says so) until a node is live.
            meta = stored.record.meta
            owner = sm.owner(meta)
            if meta.state in (sm.ASSIGNED, sm.ASSIGNING) and (
                owner is None or owner.server_id not in alive
            ):
                node = owner.server_id if owner is not None else None
                jobs.append(MarkUnavailable(name, stored.version, node))
            targets[name] = None
            continue
        load[chosen] = load.get(chosen, 0) + 1
        targets[name] = chosen
        jobs.append(Reassign(name, stored.version, _ref(snapshot, chosen), need[name]))
    return jobs, targets


def _hold(
    snapshot: Snapshot,
    seen: Observations,
    record: cpb.ChannelRecord,
    holder: sm.NodeRef | None,
    now: float,
) -> str:
    """catch_up.hold for one single-replica pchannel: is its holder gone, since when."""
    if holder is None:
        return ""
    node = holder.server_id
    left = snapshot.memory.lost_at.get(node)
    out_of_set = node not in snapshot.nodes
    gone_for = now - left if out_of_set and left is not None else None
    gone = _gone(snapshot, seen, node)
    return catch_up.hold(holder, gone, gone_for, record.allow_data_loss, snapshot.grace)


def _gone(snapshot: Snapshot, seen: Observations, node: int) -> bool:
    """Out of the node set or declared lost: its records cannot be copied now."""
    return node not in snapshot.nodes or node in seen.lost


def _replicated(
    snapshot: Snapshot,
    seen: Observations,
    alive: Collection[int],
    replicated: Mapping[str, Stored],
    now: float,
) -> list[Job]:
    """Replicated pchannels' jobs: each gets `replica_set.next_step`."""
    memory = snapshot.memory
    sets = {n: rs.member_ids(s.record) for n, s in snapshot.records.items()}
    loads = rs.replica_loads({n: m for n, m in sets.items() if m}, snapshot.nodes)
    jobs: list[Job] = []
    for name in sorted(replicated):
        stored = replicated[name]
        record = stored.record
        view = channel_view(record, memory, now)
        if view.leader is not None and rs.leader_down(view, alive, seen.down):
            view = replace(view, missing=view.missing | {view.leader})
        avoided = snapshot.drained | unfit(record, snapshot)
        step = rs.next_step(view, alive, seen.live, avoided, loads, spread(record, snapshot))
        if isinstance(step, rs.TermChange):
            for node in set(step.members) - set(rs.member_ids(record)):
                loads[node] = loads.get(node, 0) + 1  # the next placement sees it
            jobs.append(ChangeTerm(name, stored.version, step.members, step.reason))
        elif isinstance(step, rs.Rejoin):
            jobs.append(Rejoin(name, stored.version, step.nodes))
        elif isinstance(step, rs.Wait):
            meta = record.meta
            if meta.state == sm.ASSIGNED and meta.node.server_id not in alive:
                jobs.append(MarkUnavailable(name, stored.version, meta.node.server_id, step.reason))
        elif record.previous_members and joint_done(record, memory.reports):
            jobs.append(CompleteJoint(name, stored.version))
    return jobs


def _rebalance(
    snapshot: Snapshot,
    seen: Observations,
    single: Mapping[str, Stored],
    targets: Mapping[str, int | None],
) -> list[Reassign]:
    """Moves that even the load, counted as if this round's jobs succeeded; a pchannel
    with a job this round does not move again. Replicated pchannels are not moved here:
    a drained or lost member is replaced by a term change, which prefers an up-to-date
    follower as leader."""
    placement: dict[str, int] = {}
    for name, stored in single.items():
        meta = stored.record.meta
        placed = name in targets or meta.state == sm.ASSIGNED
        node = targets.get(name, meta.node.server_id)
        if placed and node is not None and node in seen.live:
            placement[name] = node
    moves = balancer.rebalance(
        placement, seen.live, snapshot.drained, snapshot.max_moves, snapshot.tolerance
    )
    return [
        Reassign(m.channel, single[m.channel].version, _ref(snapshot, m.target), "rebalance")
        for m in moves
        if m.channel not in targets
    ]


def allowed(record: cpb.ChannelRecord, snapshot: Snapshot) -> frozenset[int]:
    """Nodes whose labels match the pchannel's node selector (all of it)."""
    return _fit(record, snapshot)[0]


def unfit(record: cpb.ChannelRecord, snapshot: Snapshot) -> frozenset[int]:
    """Nodes the pchannel's node selector excludes: treated as drained for it."""
    return _fit(record, snapshot)[1]


def _fit(record: cpb.ChannelRecord, snapshot: Snapshot) -> tuple[frozenset[int], frozenset[int]]:
    """(allowed, unfit), worked out once per selector and snapshot: a round asks for
    every pchannel, and most share a selector (at 10,000 pchannels over 100 nodes the
    node walk per pchannel was a million label checks a round)."""
    key = tuple(sorted(record.node_selector.items()))
    got = snapshot.fit.get(key)
    if got is None:
        want = dict(key)
        ok = frozenset(
            n
            for n in snapshot.nodes
            if all(snapshot.labels.get(n, {}).get(k) == v for k, v in want.items())
        )
        got = snapshot.fit[key] = (ok, frozenset(snapshot.nodes) - ok)
    return got


def spread(record: cpb.ChannelRecord, snapshot: Snapshot) -> rs.Spread | None:
    """The pchannel's anti-affinity over the nodes' domains (None: any distinct nodes)."""
    if record.anti_affinity == "None" or not snapshot.domains:
        return None
    return rs.Spread(snapshot.domains, required=record.anti_affinity != "Preferred")


def _unschedulable(
    snapshot: Snapshot, seen: Observations, live_records: Mapping[str, Stored]
) -> list[Unschedulable]:
    """A note for every pchannel whose placement now excludes what it needs (or no longer
    does), when that differs from what was last said (`memory.unschedulable`)."""
    out = []
    for name, stored in sorted(live_records.items()):
        why = placement_problem(stored.record, snapshot, seen.live)
        if why != snapshot.memory.unschedulable.get(name, ""):
            out.append(Unschedulable(name, stored.version, why))
    return out


def placement_problem(record: cpb.ChannelRecord, snapshot: Snapshot, live: Collection[int]) -> str:
    """Why the pchannel's placement leaves it no node (single replica) or fewer than a
    majority of its replicas (replicated) among the live nodes; "" when it does not (a
    lack of nodes of any kind is NotEnoughNodes, not a placement problem)."""
    live_nodes = set(live) & set(snapshot.nodes)
    fit = sorted(allowed(record, snapshot) & live_nodes)
    wanted = max(record.replicas, 1)
    need = wanted // 2 + 1 if wanted > 1 else 1
    if len(live_nodes) < need:
        return ""
    selector = ", ".join(f"{k}={v}" for k, v in sorted(record.node_selector.items()))
    if len(fit) < need:
        return (
            f"placement.nodeSelector {{{selector}}} matches {len(fit)} of {len(live_nodes)} "
            f"live streaming nodes; {need} needed"
        )
    how = spread(record, snapshot)
    if how is not None and how.required:
        domains = {how.domain(n) for n in fit}
        if len(domains) < need:
            return (
                f"placement.antiAffinity Required: {len(fit)} eligible nodes span "
                f"{len(domains)} topology domains; {need} needed"
            )
    return ""


def retention_due(record: cpb.ChannelRecord) -> bool:
    """An ASSIGNED pchannel whose wanted retention its members have not all taken yet."""
    return (
        record.meta.state == sm.ASSIGNED
        and record.HasField("retention")
        and record.retention != record.applied_retention
    )


def remove_stale(
    snapshot: Snapshot,
    metas: Mapping[str, pb.PChannelMeta],
    names: AbstractSet[str] | None = None,
) -> list[RemoveStale]:
    """Every (pchannel, term) a node reports serving without owning it at that term
    (only pchannels in `names` unless None)."""
    records = snapshot.records
    if names is not None:
        records = {n: records[n] for n in names if n in records}
    members = members_by_channel(records)
    out = []
    for node, report in sorted(snapshot.memory.reports.items()):
        if node not in snapshot.nodes:
            continue
        if names is None:
            served = report.served()
        else:  # a lookup per name: the work follows `names`, not the report
            got = report.channels
            served = [got[n].pchannel for n in sorted(names) if n in got]
        for info in sm.stale_channels(node, served, metas, members):
            out.append(RemoveStale(_ref(snapshot, node), info.name, info.term))
    return out


def _ref(snapshot: Snapshot, node: int) -> sm.NodeRef:
    return sm.node_ref(snapshot.nodes, node)


# ----------------------------------------------------------------- views


def leader_counts(metas: Iterable[pb.PChannelMeta]) -> dict[int, int]:
    """ASSIGNED pchannels per owner (leader) node."""
    out: dict[int, int] = {}
    for meta in metas:
        if meta.state == sm.ASSIGNED:
            out[meta.node.server_id] = out.get(meta.node.server_id, 0) + 1
    return out


def members_by_channel(records: Mapping[str, Stored]) -> dict[str, set[int]]:
    """Member nodes of every live replicated pchannel: they may serve it (lead or follow)."""
    return {
        n: set(rs.member_ids(s.record))
        for n, s in records.items()
        if not s.record.destroyed and rs.is_replicated(s.record)
    }


def missing_single(
    metas: Mapping[str, pb.PChannelMeta],
    reports: Mapping[int, NodeReport],
    assigned_at: Mapping[str, float],
) -> set[str]:
    """ASSIGNED pchannels whose live owner, probed after the assignment, does not serve them
    at their term. Walks `metas` (a round's pchannels), not every node's report: a round
    over what changed costs what changed (at 4,096 x 3, building every report's served
    list each round was a third of an idle coord's CPU)."""
    out: set[str] = set()
    for name, meta in metas.items():
        report = reports.get(meta.node.server_id) if meta.state == sm.ASSIGNED else None
        if report is None or assigned_at.get(name, 0.0) >= report.started:
            continue
        status = report.channels.get(name)
        if status is None or status.pchannel.term != meta.channel.term:
            out.add(name)
    return out


def leader_status(
    record: cpb.ChannelRecord, reports: Mapping[int, NodeReport]
) -> pb.PChannelStatus | None:
    """What the leader last reported of the pchannel at its current term."""
    meta = record.meta
    report = reports.get(meta.node.server_id)
    status = report.channels.get(meta.channel.name) if report else None
    if status is None or status.pchannel.term != meta.channel.term or status.role != LEADER:
        return None
    return status


def missing_members(record: cpb.ChannelRecord, memory: Memory) -> frozenset[int]:
    """Members probed after the last assignment that do not serve it in their role,
    or whose log of it lost acknowledged records, or that say they cannot serve it well
    (a leader then fails over)."""
    return frozenset(n for n in rs.member_ids(record) if member_missing(record, memory, n))


def member_missing(record: cpb.ChannelRecord, memory: Memory, node: int) -> bool:
    """Whether `node` is one of `missing_members` (asked per probe for the probed node)."""
    meta = record.meta
    name = meta.channel.name
    report = memory.reports.get(node)
    since = max(memory.assigned_at.get(name, 0.0), memory.rejoined_at.get((name, node), 0.0))
    if report is None or report.started <= since:
        return False
    status = report.channels.get(name)
    want = LEADER if node == meta.node.server_id else FOLLOWER
    return (
        status is None
        or status.pchannel.term != meta.channel.term
        or status.role != want
        or bool(status.data_loss)
        or bool(status.unhealthy)
    )


def caught_up(record: cpb.ChannelRecord, memory: Memory, now: float) -> frozenset[int]:
    """Followers the leader last reported at its log end (lag 0); none while a handover
    the leader won backs off."""
    status = leader_status(record, memory.reports)
    if status is None or now < memory.handover_after.get(record.meta.channel.name, 0):
        return frozenset()
    return frozenset(p.node_id for p in status.replicas if p.lag == 0)


def channel_view(record: cpb.ChannelRecord, memory: Memory, now: float) -> rs.ChannelView:
    meta = record.meta
    members = rs.current_members(record)
    return rs.ChannelView(
        assigned=meta.state == sm.ASSIGNED,
        placed=bool(members),
        leader=(meta.node.server_id if record.members else members[0]) if members else None,
        members=members,
        previous=tuple(m.server_id for m in record.previous_members),
        wanted=max(record.replicas, 1),
        missing=missing_members(record, memory) if meta.state == sm.ASSIGNED else frozenset(),
        caught_up=caught_up(record, memory, now),
    )


def joint_done(record: cpb.ChannelRecord, reports: Mapping[int, NodeReport]) -> bool:
    """Whether the leader reports every member holding the log up to the change point."""
    status = leader_status(record, reports)
    if status is None:
        return False
    acked = {p.node_id: p.acked_offset for p in status.replicas}
    return rs.joint_complete(
        rs.member_ids(record), record.meta.node.server_id, record.joint_until, acked
    )


def clock_skewed(offset: float, uncertainty: float, bound: float, was: bool) -> bool:
    """Whether a node's clock is off ours by more than `bound`, from one probe's estimate
    `offset`, known within `uncertainty` (half the probe's round trip: the node read its
    clock somewhere between our send and our receipt). Only a sure verdict replaces the
    last one (`was`): a slow round trip (a loaded loop on either side) proves nothing
    either way. Judged on `offset` alone, healthy nodes of one host were found 1.3 s off
    under load and led nothing (issue 24)."""
    if abs(offset) - uncertainty > bound:
        return True
    if abs(offset) + uncertainty <= bound:
        return False
    return was


def needs_action(node: int, snapshot: Snapshot) -> set[str]:
    """The pchannels `node`'s latest report asks a round for (none: empty): those it
    serves stale, replicated ones it is a missing member of, and its own it misses
    although they were assigned before the probe.

    Only the pchannels the node reports or its records name are looked at: the work per
    probe grows with the node's share, not with the cluster (issue 24)."""
    report = snapshot.memory.reports.get(node)
    if report is None:
        return set()
    records = snapshot.records
    served = report.served()
    if snapshot.held is not None:
        named: Iterable[str] = snapshot.held.get(node, ())
    else:
        named = [n for n, s in records.items() if node in rs.held_by(s.record)]
    mine = {n: records[n] for n in {i.name for i in served}.union(named) if n in records}
    metas = {n: s.record.meta for n, s in mine.items() if not s.record.destroyed}
    replicated = members_by_channel(mine)
    out = {i.name for i in sm.stale_channels(node, served, metas, replicated)}
    for name in replicated:
        record = mine[name].record
        if record.meta.state == sm.ASSIGNED and member_missing(record, snapshot.memory, node):
            out.add(name)
    out.update(
        n
        for n in sm.missing_channels(node, served, metas)
        if snapshot.memory.assigned_at.get(n, 0.0) < report.started
    )
    return out


def describe_replication(
    record: cpb.ChannelRecord, reports: Mapping[int, NodeReport], out: cpb.ChannelDescription
) -> None:
    """Fill the replication part of a description from the record and the leader."""
    out.replicas = max(record.replicas, 1)
    out.members.extend(record.members)
    status = leader_status(record, reports)
    if status is not None:
        out.progress.extend(status.replicas)
        out.next_offset = status.next_offset
        out.commit_offset = status.commit_offset
        out.first_offset = status.first_offset
        out.size_bytes = status.size_bytes
