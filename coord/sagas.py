"""Every job of a round as a fixed sequence of steps. Pure, no I/O.

A saga is a generator: it yields a step (persist a record, call nodes, announce an
outcome), the executor runs it and sends back its outcome, and the saga yields the next
step or returns its result. The same saga run with the same outcomes yields the same
steps, so a table of outcomes tests a whole reassignment or term change without a node.

Every step that changes something is idempotent or fenced by the term, and every saga
starts by persisting its intent: a coord that dies after any step finds the record
ASSIGNING and the next round resumes it (`state_machine.next_actions`) or, for a
replicated pchannel, starts over under yet another term (never choosing twice under one
term: two leaders of one term could have written different records under it).

A replicated term change (placement, failover, replacement of a lost or drained member,
handover, resuming a half-done change):

1. persist ASSIGNING: term + 1, the new member set (and the previous set, while members
   change: joint quorum), the old leader pushed into histories;
2. Fence every alive voter and new member at the new term, in parallel, bounded: from
   then on the old leader cannot reach a quorum, so nothing more becomes committed;
3. choose the leader from the voters' reports (`leader_choice`: a majority of every
   voting set required);
4. Assign LEADER (with the members) to it;
5. Assign FOLLOWER to the other live members (best effort: a failure rejoins later);
6. persist ASSIGNED with the leader; AssignmentDiscover tells clients.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamwal.coord import catch_up
from streamwal.coord import leader_choice as lc
from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.errors import Code, StreamingError
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

LEADER = pb.ReplicaRole.REPLICA_ROLE_LEADER
FOLLOWER = pb.ReplicaRole.REPLICA_ROLE_FOLLOWER
SINGLE_STEPS = (
    sm.Step.PERSIST_ASSIGNING,
    sm.Step.REMOVE,
    sm.Step.ASSIGN,
    sm.Step.PERSIST_ASSIGNED,
)
TERM_CHANGE_STEPS = (
    sm.Step.PERSIST_ASSIGNING,
    sm.Step.FENCE,
    sm.Step.ASSIGN,
    sm.Step.ASSIGN_FOLLOWERS,
    sm.Step.PERSIST_ASSIGNED,
)


# ----------------------------------------------------------------- steps


@dataclass(frozen=True)
class Persist:
    """Write `record` to the meta store (then the view and AssignmentDiscover follow)."""

    record: cpb.ChannelRecord
    step: sm.Step


@dataclass(frozen=True)
class Remove:
    """Remove the pchannel at `term` on `node`; outcome: the error, or None."""

    node: sm.NodeRef
    name: str
    term: int
    timeout: float
    step: sm.Step = sm.Step.REMOVE


@dataclass(frozen=True)
class Assign:
    """Assign the pchannel at `term` to `node`; outcome: the error, or None."""

    node: sm.NodeRef
    name: str
    term: int
    timeout: float
    catch_up_from: str = ""
    min_next_offset: int = 0
    replica_set: pb.ReplicaSet | None = None
    accept_data_loss: bool = False
    retention: pb.RetentionPolicy | None = None  # the record's, on every Assign
    step: sm.Step = sm.Step.ASSIGN


@dataclass(frozen=True)
class Fence:
    """Fence every node at `term`, in parallel; outcome: the reports of those that
    answered (list[leader_choice.FenceReport])."""

    nodes: tuple[sm.NodeRef, ...]
    name: str
    term: int
    timeout: float
    step: sm.Step = sm.Step.FENCE


@dataclass(frozen=True)
class AssignFollowers:
    """Assign followers in parallel, best effort; outcome: list[bool], done or not."""

    assigns: tuple[Assign, ...]
    step: sm.Step = sm.Step.ASSIGN_FOLLOWERS


@dataclass(frozen=True)
class Announce:
    """Log `message` (and tell the listener `notify`, if set). Not an I/O step."""

    level: int
    message: str
    fields: Mapping[str, Any]
    notify: str = ""
    notify_fields: Mapping[str, Any] | None = None


Step = Persist | Remove | Assign | Fence | AssignFollowers | Announce


# ----------------------------------------------------------------- results


@dataclass(frozen=True)
class Assigned:
    """The (re)assignment is done: report it (`fields` go to the log and the listener)."""

    reason: str
    fields: dict[str, Any]
    handover_kept: bool = False  # a drained leader kept leading: back off before retrying


@dataclass(frozen=True)
class Failed:
    """The saga stopped (announced); `node` is the target an Assign failed on, if any;
    `data_loss` why the only copy of the pchannel lost acknowledged records, if it did."""

    node: int | None = None
    data_loss: str = ""


Result = Assigned | Failed | None
Saga = Generator[Step, Any, Result]


# ----------------------------------------------------------------- round context


PER_CALL_S = 0.01  # how much longer a deadline gets per call the node answers at once


@dataclass(frozen=True)
class Timeouts:
    assign: float = 5.0
    remove: float = 1.0
    fence: float = 2.0
    extra: float = 0.0  # what `scaled` added to each

    @property
    def follower(self) -> float:
        """A follower's Assign (best effort: it rejoins later) waits less, but as much
        longer per call as the others: the unscaled 2 s failed most followers of a
        1,024-pchannel placement, each another rejoin round (issue 24)."""
        return min(self.assign, 2.0 + self.extra)

    @property
    def remove_lost(self) -> float:
        """A node declared lost gets a short wait: it is most likely down."""
        return min(0.3, self.remove)

    def scaled(self, per_node: float) -> Timeouts:
        """Deadlines for a round that asks each node about `per_node` things at once:
        `PER_CALL_S` more each (a node answers a burst one after another; a deadline
        fit for one call failed most of a failover's calls, issue 24)."""
        extra = PER_CALL_S * max(0.0, per_node - 1)
        return Timeouts(
            self.assign + extra, self.remove + extra, self.fence + extra, self.extra + extra
        )


@dataclass
class Round:
    """What the sagas of one round share. `leaders` (pchannels led per node) is counted
    up as term changes choose, so that pchannels placed in one round get different
    leaders: the only state sagas write, and only between their own steps."""

    nodes: Mapping[int, str]
    alive: frozenset[int]
    live: frozenset[int]
    lost: frozenset[int]
    drained: frozenset[int]
    timeouts: Timeouts = field(default_factory=Timeouts)
    leaders: dict[int, int] = field(default_factory=dict)
    # The highest term any node reported per pchannel (Memory.seen_term): new terms
    # start above it (state_machine.begin_assignment).
    seen_terms: Mapping[str, int] = field(default_factory=dict)

    def ref(self, node: int, record: cpb.ChannelRecord | None = None) -> sm.NodeRef:
        return sm.node_ref(self.nodes, node, record.members if record is not None else ())

    def remove_timeout(self, node: int) -> float:
        return self.timeouts.remove_lost if node in self.lost else self.timeouts.remove

    def gone(self, node: int) -> bool:
        """Out of the node set or declared lost: its records cannot be copied."""
        return node not in self.nodes or node in self.lost


def _copy(record: cpb.ChannelRecord) -> cpb.ChannelRecord:
    out = cpb.ChannelRecord()
    out.CopyFrom(record)
    return out


def _assign_failed(name: str, node: object, term: int, error: str) -> Announce:
    return Announce(
        logging.WARNING,
        "assign failed",
        {"pchannel": name, "node": node, "term": term, "error": error},
        notify="assign-failed",
        notify_fields={"node": node, "term": term, "error": error},
    )


# ----------------------------------------------------------------- single replica


def reassignment(
    before: cpb.ChannelRecord,
    target: sm.NodeRef | None,
    reason: str,
    holder: sm.NodeRef | None,
    seen_next: int,
    ctx: Round,
    accept_data_loss: bool = False,
) -> Saga:
    """Move a single-replica pchannel to `target` (None: finish the persisted move).

    `holder`: the node with its records (catch_up.data_holder); the new owner copies from
    it unless it is gone (then the move is an unclean failover, announced). A node that
    refuses with DATA_LOSS (its only copy lost acknowledged records) stops the move: the
    pchannel is persisted UNAVAILABLE and announced, until `accept_data_loss` (an
    operator's explicit consent) lets its holder take a new term above every offset it
    acknowledged."""
    name = before.meta.channel.name
    record = _copy(before)
    if target is not None:
        record.meta.CopyFrom(
            sm.begin_assignment(before.meta, target, seen_term=ctx.seen_terms.get(name, 0))
        )
        yield Persist(_copy(record), sm.Step.PERSIST_ASSIGNING)
    plan: catch_up.CatchUpPlan | None = None
    for action in sm.next_actions(record.meta):
        if isinstance(action, sm.RemoveOld):
            node = action.node
            timeout = ctx.remove_timeout(node.server_id)
            yield Remove(node, action.name, action.term, timeout)
        elif isinstance(action, sm.AssignNew):
            lost = holder is not None and ctx.gone(holder.server_id)
            plan = catch_up.plan(holder, action.node, lost, seen_next)
            error = yield Assign(
                action.node,
                name,
                action.term,
                ctx.timeouts.assign,
                catch_up_from=plan.catch_up_from,
                min_next_offset=plan.min_next_offset,
                accept_data_loss=accept_data_loss,
                retention=_retention(before),
            )
            if isinstance(error, StreamingError) and error.code == Code.STREAMING_CODE_DATA_LOSS:
                return (yield from _data_lost(record, str(error)))
            if error is not None:
                yield _assign_failed(name, action.node.server_id, action.term, str(error))
                return Failed(action.node.server_id)
            if plan.unclean:
                unclean = {
                    "pchannel": name,
                    "old_node": holder.server_id if holder else None,
                    "new_node": action.node.server_id,
                    "new_term": action.term,
                    "min_next_offset": plan.min_next_offset,
                    "stranded": "records the lost node acknowledged at or after min_next_offset",
                }
                yield Announce(logging.WARNING, "unclean failover", unclean, "unclean-failover")
        else:
            record.meta.CopyFrom(action.meta)
            _applied(record)
            yield Persist(_copy(record), sm.Step.PERSIST_ASSIGNED)
    previous = sm.owner(before.meta)
    fields: dict[str, Any] = {
        "pchannel": name,
        "reason": reason,
        "old_node": previous.server_id if previous else None,
        "new_node": record.meta.node.server_id,
        "old_term": before.meta.channel.term,
        "new_term": record.meta.channel.term,
    }
    if plan is not None:
        fields["catch_up_from"] = plan.catch_up_from or None
        fields["unclean"] = plan.unclean
    return Assigned(reason, fields)


def _data_lost(record: cpb.ChannelRecord, cause: str) -> Saga:
    """The only copy lost acknowledged records: stop moving it (a copy of the damaged log
    would only hide the loss), persist UNAVAILABLE, say so."""
    name = record.meta.channel.name
    if record.meta.state != sm.UNAVAILABLE:
        out = _copy(record)
        out.meta.CopyFrom(sm.mark_unavailable(record.meta))
        yield Persist(out, sm.Step.PERSIST_UNAVAILABLE)
    fields = {"pchannel": name, "cause": cause}
    yield Announce(
        logging.ERROR, "pchannel lost acknowledged records", fields, "data-loss", {"cause": cause}
    )
    return Failed(data_loss=cause)


def mark_unavailable(
    before: cpb.ChannelRecord, node: int | None, reason: str, code: str = ""
) -> Saga:
    """No live node can take the pchannel, or it waits for the node holding its only
    copy (`code` WaitingForReplica): UNAVAILABLE, term and node kept (the next
    assignment fences the lost node through histories)."""
    name = before.meta.channel.name
    record = _copy(before)
    record.meta.CopyFrom(sm.mark_unavailable(before.meta))
    yield Persist(record, sm.Step.PERSIST_UNAVAILABLE)
    if reason:
        fields = {"pchannel": name, "reason": reason}
        told: dict[str, Any] = {"node": node, "reason": reason, "code": code}
        yield Announce(logging.WARNING, "pchannel unavailable", fields, "unavailable", told)
    else:
        fields = {"pchannel": name}
        yield Announce(
            logging.WARNING, "pchannel unavailable: no live node", fields, "unavailable",
            {"node": node},
        )  # fmt: skip
    return None


def remove_stale(node: sm.NodeRef, name: str, term: int, ctx: Round) -> Saga:
    yield Remove(node, name, term, ctx.remove_timeout(node.server_id))
    return None


# ----------------------------------------------------------------- replicated


def term_change(
    before: cpb.ChannelRecord, members: tuple[int, ...], reason: str, ctx: Round
) -> Saga:
    """A replicated pchannel's term change onto `members` (module docstring, steps 1-6)."""
    name = before.meta.channel.name
    old_members = rs.current_members(before)  # a single owner growing to a set included
    old_leader = old_members[0] if old_members and not before.members else None
    if before.members:
        old_leader = before.meta.node.server_id
    previous = list(before.previous_members)
    if not previous and old_members and set(members) != set(old_members):
        previous = [ctx.ref(n, before).to_proto() for n in old_members]
    # Committed records are on a majority of the old set (and of a pending previous one).
    voters = [old_members, tuple(m.server_id for m in previous)]
    new_refs = [ctx.ref(n, before) for n in members]
    hint = old_leader if old_leader in members else members[0]

    record = _copy(before)
    record.meta.CopyFrom(
        sm.begin_assignment(
            before.meta,
            ctx.ref(hint, before),
            reuse_term=_unled(before),
            seen_term=ctx.seen_terms.get(name, 0),
        )
    )
    record.unled_term = 0  # from here on an Assign may go out under this term
    del record.members[:]
    record.members.extend(r.to_proto() for r in new_refs)
    del record.previous_members[:]
    record.previous_members.extend(previous)
    if not previous:
        record.joint_until = 0
    term = record.meta.channel.term
    yield Persist(_copy(record), sm.Step.PERSIST_ASSIGNING)

    targets = {n for v in voters for n in v} | set(members)
    fenced = tuple(ctx.ref(n, before) for n in sorted(targets) if n in ctx.alive)
    reports: list[lc.FenceReport] = yield Fence(fenced, name, term, ctx.timeouts.fence)
    leaders = ctx.leaders
    voting = [v for v in voters if v] or [members]
    answers = {r.node: r for r in reports}

    def choose(candidates: list[int]) -> lc.Choice | lc.NoChoice:
        return lc.choose_leader(
            answers,
            voting,
            candidates=candidates,
            rank=lambda n: (n in ctx.drained, n != old_leader, leaders.get(n, 0), n),
        )

    choice = choose([n for n in members if n in ctx.alive])
    if isinstance(choice, lc.NoChoice):
        # The most complete log may be on a voter this change was replacing (lost when
        # the change began, back now): it leads, in place of a member being added, or
        # the pchannel would wait for ever (every attempt another term, issue 24).
        wider = choose(sorted({n for v in voting for n in v if n in ctx.alive}))
        stable = [m.server_id for m in previous] or old_members  # the set it started from
        revised = (
            rs.readmit(members, wider.leader, stable) if isinstance(wider, lc.Choice) else None
        )
        if revised is not None and isinstance(wider, lc.Choice):
            yield Announce(
                logging.INFO,
                "most complete log on a replaced member: it stays and leads",
                {"pchannel": name, "term": term, "node": wider.leader, "members": list(revised)},
            )
            choice, members = wider, revised
            new_refs = [ctx.ref(n, before) for n in members]
            del record.members[:]
            record.members.extend(r.to_proto() for r in new_refs)
    if isinstance(choice, lc.NoChoice):
        record.unled_term = term  # nothing was assigned under it: the next try reuses it
        yield Persist(_copy(record), sm.Step.PERSIST_ASSIGNING)
        yield Announce(
            logging.WARNING,
            "no leader chosen",
            {"pchannel": name, "term": term, "reason": choice.reason},
            notify="assign-failed",
            notify_fields={"node": f"one of {list(members)}", "term": term, "error": choice.reason},
        )
        return Failed()

    leader = ctx.ref(choice.leader, before)
    leaders[leader.server_id] = leaders.get(leader.server_id, 0) + 1
    if old_leader is not None and before.meta.state == sm.ASSIGNED:
        leaders[old_leader] = max(leaders.get(old_leader, 0) - 1, 0)
    protos = [r.to_proto() for r in new_refs]
    leading = pb.ReplicaSet(role=LEADER, members=protos, leader=leader.to_proto())
    policy = _retention(before)
    error: StreamingError | None = yield Assign(
        leader, name, term, ctx.timeouts.assign, replica_set=leading, retention=policy
    )
    if error is not None:
        yield _assign_failed(name, leader.server_id, term, str(error))
        return Failed()
    following = pb.ReplicaSet(role=FOLLOWER, members=protos, leader=leader.to_proto())
    yield AssignFollowers(
        tuple(
            Assign(r, name, term, ctx.timeouts.follower, replica_set=following, retention=policy)
            for r in new_refs
            if r.server_id != leader.server_id and r.server_id in ctx.live
        )
    )

    record.meta.node.CopyFrom(leader.to_proto())
    record.meta.CopyFrom(sm.finish_assignment(record.meta))
    record.joint_until = choice.next_offset if previous else 0
    _applied(record)
    yield Persist(_copy(record), sm.Step.PERSIST_ASSIGNED)
    fields = {
        "pchannel": name,
        "reason": reason,
        "old_node": old_leader,
        "new_node": choice.leader,
        "old_term": before.meta.channel.term,
        "new_term": term,
        "members": list(members),
        "next_offset": choice.next_offset,
    }
    return Assigned(reason, fields, reason == "handover" and choice.leader == old_leader)


def _unled(record: cpb.ChannelRecord) -> bool:
    """Whether the record's term had an attempt that chose no leader and nothing since:
    fencing again under it is safe (no node was told to lead or follow under it)."""
    meta = record.meta
    return meta.state == sm.ASSIGNING and 0 < meta.channel.term == record.unled_term


def rejoin(before: cpb.ChannelRecord, nodes: tuple[int, ...], ctx: Round) -> Saga:
    """Assign returning members as followers under the current term (they cut any
    divergent suffix themselves, from the leader's term history)."""
    meta = before.meta
    name, term = meta.channel.name, meta.channel.term
    leader = meta.node.server_id
    done = yield AssignFollowers(tuple(_in_role(before, n, ctx) for n in nodes if n != leader))
    if any(done):
        fields = {"pchannel": name, "term": term, "nodes": list(nodes)}
        yield Announce(logging.INFO, "followers rejoined", fields)
    return None


def unschedulable(before: cpb.ChannelRecord, reason: str) -> Saga:
    """Say that the pchannel's placement excludes the nodes it needs ("": no longer)."""
    name = before.meta.channel.name
    level = logging.WARNING if reason else logging.INFO
    message = "placement unschedulable" if reason else "placement schedulable again"
    fields = {"pchannel": name, "reason": reason}
    yield Announce(level, message, fields, "unschedulable", {"reason": reason})
    return None


def apply_retention(before: cpb.ChannelRecord, ctx: Round) -> Saga:
    """Give every alive member (or the single owner) the record's retention under the
    current term, each in its role; once all of them took it, persist it as applied
    (what status shows). A member away now gets it with its next Assign (rejoin)."""
    meta = before.meta
    name, term = meta.channel.name, meta.channel.term
    policy = _retention(before)
    members = [m.server_id for m in before.members] or [meta.node.server_id]
    assigns = tuple(_in_role(before, n, ctx) for n in members if n in ctx.alive)
    done = yield AssignFollowers(assigns)
    if not all(done):
        return None  # tried again next round
    record = _copy(before)
    _applied(record)
    yield Persist(record, sm.Step.PERSIST_RETENTION)
    fields = {"pchannel": name, "term": term, "nodes": [a.node.server_id for a in assigns]}
    fields |= {"max_age_ms": policy.max_age_ms, "max_bytes": policy.max_bytes} if policy else {}
    yield Announce(logging.INFO, "retention applied", fields)
    return None


def _in_role(record: cpb.ChannelRecord, node: int, ctx: Round) -> Assign:
    """An Assign of `node` under the record's current term in its role there (leader or
    follower of the record's set; none for a single copy), with the record's retention."""
    meta = record.meta
    leader = sm.NodeRef.from_proto(meta.node)
    role = LEADER if node == leader.server_id else FOLLOWER
    rs = (
        pb.ReplicaSet(role=role, members=list(record.members), leader=leader.to_proto())
        if record.members
        else None
    )
    return Assign(
        ctx.ref(node, record),
        meta.channel.name,
        meta.channel.term,
        ctx.timeouts.follower,
        replica_set=rs,
        retention=_retention(record),
    )


def _retention(record: cpb.ChannelRecord) -> pb.RetentionPolicy | None:
    """The record's retention for an Assign (None: the node keeps its own)."""
    return record.retention if record.HasField("retention") else None


def _applied(record: cpb.ChannelRecord) -> None:
    """Every member taking part in this step got the record's retention: say so."""
    if record.HasField("retention"):
        record.applied_retention.CopyFrom(record.retention)


def complete_joint(before: cpb.ChannelRecord) -> Saga:
    """Drop the previous set: every member holds the log up to the change point."""
    record = _copy(before)
    del record.previous_members[:]
    record.joint_until = 0
    yield Persist(record, sm.Step.PERSIST_JOINT_DONE)
    fields = {"pchannel": before.meta.channel.name, "members": list(rs.member_ids(record))}
    yield Announce(logging.INFO, "replica set change complete", fields)
    return None
