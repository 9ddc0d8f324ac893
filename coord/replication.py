"""The coord's driver for replicated pchannels (replicas > 1): term changes and rejoins.

Decisions come from `replica_set.next_step` (what a pchannel needs this round) and
`leader_choice.choose_leader` (who leads); this module sequences the I/O, with the
`Coordinator`'s store, locks, node links and liveness (it is the coordinator's own part
for replicated pchannels, and uses its internals as such).

A term change (placement, failover, replacement of a lost or drained member, resuming a
half-done change) runs, under the pchannel's lock:

1. persist ASSIGNING: term + 1, the new member set (and the previous set, while members
   change: joint quorum), the old leader pushed into histories;
2. Fence every alive voter and new member at the new term, in parallel, bounded: from
   then on the old leader cannot reach a quorum, so nothing more becomes committed;
3. choose the leader from the voters' reports (majority of every voting set required);
4. Assign LEADER (with the members) to it, then Assign FOLLOWER to the other live members;
5. persist ASSIGNED with the leader; AssignmentDiscover tells clients.

A coord that dies anywhere in between finds the pchannel ASSIGNING and starts over with
yet another term (never re-running a choice under the same term: two leaders of one term
could have written different records under it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from contextlib import suppress
from typing import TYPE_CHECKING

from streamwal.coord import leader_choice as lc
from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.coord.liveness import Liveness
from streamwal.coord.meta_store import VersionConflict
from streamwal.errors import StreamingError
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.coord.coordinator import Coordinator

log = logging.getLogger("streamwal.coord.replication")

LEADER = pb.ReplicaRole.REPLICA_ROLE_LEADER
FOLLOWER = pb.ReplicaRole.REPLICA_ROLE_FOLLOWER
HANDOVER_BACKOFF = 5.0  # seconds before a drained leader that kept leading tries again


def is_replicated(record: cpb.ChannelRecord) -> bool:
    """Replicated pchannels run through this driver; the others through the single path."""
    return record.replicas > 1 or len(record.members) > 0


def member_ids(record: cpb.ChannelRecord) -> tuple[int, ...]:
    return tuple(m.server_id for m in record.members)


def _failed(emit, what: str, name: str, node: int, term: int, err: StreamingError) -> None:
    emit(what, extra={"pchannel": name, "node": node, "term": term, "error": str(err)})


class ReplicationDriver:
    """Runs the replicated pchannels of one Coordinator."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        # The latest CollectStatus of every node: (probe start, {pchannel: status}).
        self.reports: dict[int, tuple[float, dict[str, pb.PChannelStatus]]] = {}
        # When a member was last assigned on its own (rejoin): only a later probe tells.
        self._rejoined_at: dict[tuple[str, int], float] = {}
        # A handover the drained leader won (it still had the longest log): retry later.
        self._handover_after: dict[str, float] = {}
        # Pchannels led per node, counted by this round's choices as they are made, so that
        # pchannels placed in one round get different leaders.
        self._leaders: dict[int, int] = {}

    # ----------------------------------------------------------------- observations

    def observe(self, node: int, started: float, channels: Iterable[pb.PChannelStatus]) -> None:
        """Keep a node's report; a leader's report updates its followers' progress metrics."""
        statuses = {c.pchannel.name: c for c in channels}
        self.reports[node] = (started, statuses)
        for name, status in statuses.items():
            stored = self.coord._records.get(name)
            if stored is None or not is_replicated(stored.record) or status.role != LEADER:
                continue
            meta = stored.record.meta
            if meta.node.server_id == node and status.pchannel.term == meta.channel.term:
                self.coord.metrics.set_replicas(name, status)

    def forget(self, node: int) -> None:
        self.reports.pop(node, None)

    def leader_status(self, record: cpb.ChannelRecord) -> pb.PChannelStatus | None:
        """What the leader last reported of the pchannel at its current term."""
        meta = record.meta
        report = self.reports.get(meta.node.server_id)
        status = report[1].get(meta.channel.name) if report else None
        if status is None or status.pchannel.term != meta.channel.term or status.role != LEADER:
            return None
        return status

    def members_by_channel(self) -> dict[str, set[int]]:
        """Member nodes of every replicated pchannel: they may serve it (lead or follow)."""
        return {
            s.name: set(member_ids(s.record))
            for s in self.coord._records.values()
            if not s.record.destroyed and is_replicated(s.record)
        }

    def missing(self, record: cpb.ChannelRecord) -> frozenset[int]:
        """Members probed after the last assignment that do not serve it in their role,
        or whose log of it lost acknowledged records, or that say they cannot serve it well
        (a leader then fails over)."""
        meta = record.meta
        name, term = meta.channel.name, meta.channel.term
        assigned_at = self.coord._assigned_at.get(name, 0.0)
        out = set()
        for node in member_ids(record):
            report = self.reports.get(node)
            since = max(assigned_at, self._rejoined_at.get((name, node), 0.0))
            if report is None or report[0] <= since:
                continue
            status = report[1].get(name)
            want = LEADER if node == meta.node.server_id else FOLLOWER
            if (
                status is None
                or status.pchannel.term != term
                or status.role != want
                or status.data_loss
                or status.unhealthy
            ):
                out.add(node)
        return frozenset(out)

    def view(self, record: cpb.ChannelRecord) -> rs.ChannelView:
        meta = record.meta
        members = member_ids(record)
        return rs.ChannelView(
            assigned=meta.state == sm.ASSIGNED,
            placed=bool(members),
            leader=meta.node.server_id if members else None,
            members=members,
            previous=tuple(m.server_id for m in record.previous_members),
            wanted=max(record.replicas, 1),
            missing=self.missing(record) if meta.state == sm.ASSIGNED else frozenset(),
            caught_up=self.caught_up(record),
        )

    def caught_up(self, record: cpb.ChannelRecord) -> frozenset[int]:
        """Followers the leader last reported at its log end (lag 0)."""
        status = self.leader_status(record)
        if status is None or self.coord.clock() < self._handover_after.get(
            record.meta.channel.name, 0
        ):
            return frozenset()
        return frozenset(p.node_id for p in status.replicas if p.lag == 0)

    # ----------------------------------------------------------------- the round

    async def reconcile(
        self, names: Iterable[str], alive: set[int], live: set[int], drained: set[int]
    ) -> None:
        """One round for the replicated pchannels `names`: each gets its next step."""
        records = self.coord._records
        sets = {n: member_ids(s.record) for n, s in records.items() if is_replicated(s.record)}
        loads = rs.replica_loads(sets, self.coord.config.nodes)
        self._leaders = self._leader_counts()
        jobs = []
        for name in sorted(names):
            record = records[name].record
            step = rs.next_step(self.view(record), alive, live, drained, loads)
            if isinstance(step, rs.TermChange):
                for node in set(step.members) - set(member_ids(record)):
                    loads[node] = loads.get(node, 0) + 1  # the next placement sees it
                jobs.append(self._term_change(name, step, alive, drained))
            elif isinstance(step, rs.Rejoin):
                jobs.append(self._rejoin(name, step.nodes))
            elif isinstance(step, rs.Wait):
                jobs.append(self._wait(name, step, alive))
            elif record.previous_members:
                jobs.append(self._complete_joint(name))
        if jobs:
            await asyncio.gather(*jobs)

    async def _wait(self, name: str, step: rs.Wait, alive: set[int]) -> None:
        """Mark the pchannel UNAVAILABLE (once) when its leader is gone and nothing can be done."""
        async with self.coord._lock(name):
            stored = self.coord._records.get(name)
            if stored is None or stored.record.destroyed:
                return
            meta = stored.record.meta
            if meta.state != sm.ASSIGNED or meta.node.server_id in alive:
                return
            try:
                await self.coord._persist_meta(name, sm.mark_unavailable(meta))
            except VersionConflict:
                return
        log.warning("pchannel unavailable", extra={"pchannel": name, "reason": step.reason})
        self.coord._notify(
            "unavailable", name, {"node": meta.node.server_id, "reason": step.reason}
        )

    # ----------------------------------------------------------------- term change

    def _ref(self, node: int, record: cpb.ChannelRecord) -> sm.NodeRef:
        address = self.coord.config.nodes.get(node)
        if address is None:
            address = next((m.address for m in record.members if m.server_id == node), "")
        return sm.NodeRef(node, address)

    async def _fence(self, name: str, term: int, nodes: list[sm.NodeRef]) -> list[lc.FenceReport]:
        timeout = self.coord.config.fence_timeout

        async def one(node: sm.NodeRef) -> lc.FenceReport | None:
            try:
                reply = await self.coord.links.fence(node.address, name, term, timeout)
            except StreamingError as err:
                _failed(log.info, "fence failed", name, node.server_id, term, err)
                return None
            ineligible = reply.data_loss or self._ineligible(node.server_id, name)
            if ineligible:
                log.warning(
                    "replica may not lead",
                    extra={"pchannel": name, "node": node.server_id, "reason": ineligible},
                )
            return lc.FenceReport(
                node.server_id,
                reply.last_term,
                reply.next_offset,
                reply.commit_offset,
                ineligible,
            )

        got = await asyncio.gather(*(one(n) for n in nodes))
        return [r for r in got if r is not None]

    def _ineligible(self, node: int, name: str) -> str:
        """Why `node` may not lead `name` by what it last reported or how its clock is."""
        offset = self.coord.skewed.get(node)
        if offset is not None:
            return f"its clock is {offset:+.3f}s off the coord's"
        report = self.reports.get(node)
        status = report[1].get(name) if report else None
        return status.unhealthy if status is not None else ""

    def _leader_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for meta in self.coord._metas().values():
            if meta.state == sm.ASSIGNED:
                out[meta.node.server_id] = out.get(meta.node.server_id, 0) + 1
        return out

    async def _term_change(
        self, name: str, change: rs.TermChange, alive: set[int], drained: set[int]
    ) -> bool:
        try:
            return await self._run_term_change(name, change, alive, drained)
        except VersionConflict as err:
            log.info("meta changed by another writer", extra={"pchannel": name, "error": str(err)})
            return False

    async def _run_term_change(
        self, name: str, change: rs.TermChange, alive: set[int], drained: set[int]
    ) -> bool:
        coord = self.coord
        async with coord._lock(name):
            stored = coord._records.get(name)
            if stored is None or stored.record.destroyed:
                return False
            before = stored.record
            old_members = member_ids(before)
            old_leader = before.meta.node.server_id if old_members else None
            previous = [m for m in before.previous_members]
            if not previous and old_members and set(change.members) != set(old_members):
                previous = list(before.members)
            # Committed records are on a majority of the old set (and of a pending previous one).
            voters = [old_members, tuple(m.server_id for m in previous)]
            new_refs = [self._ref(n, before) for n in change.members]
            hint = old_leader if old_leader in change.members else change.members[0]

            record = cpb.ChannelRecord()
            record.CopyFrom(before)
            record.meta.CopyFrom(sm.begin_assignment(before.meta, self._ref(hint, before)))
            del record.members[:]
            record.members.extend(r.to_proto() for r in new_refs)
            del record.previous_members[:]
            record.previous_members.extend(previous)
            if not previous:
                record.joint_until = 0
            term = record.meta.channel.term
            await coord._persist(name, record)
            coord._crash_point(sm.Step.PERSIST_ASSIGNING, name)

            targets = {n for v in voters for n in v} | set(change.members)
            refs = [self._ref(n, before) for n in sorted(targets) if n in alive]
            reports = await self._fence(name, term, refs)
            leaders = self._leaders
            choice = lc.choose_leader(
                {r.node: r for r in reports},
                [v for v in voters if v] or [change.members],
                candidates=[n for n in change.members if n in alive],
                rank=lambda n: (n in drained, n != old_leader, leaders.get(n, 0), n),
            )
            if isinstance(choice, lc.NoChoice):
                log.warning(
                    "no leader chosen",
                    extra={"pchannel": name, "term": term, "reason": choice.reason},
                )
                coord._notify(
                    "assign-failed",
                    name,
                    {
                        "node": f"one of {list(change.members)}",
                        "term": term,
                        "error": choice.reason,
                    },
                )
                return False

            leader = self._ref(choice.leader, before)
            leaders[leader.server_id] = leaders.get(leader.server_id, 0) + 1
            if old_leader is not None and before.meta.state == sm.ASSIGNED:
                leaders[old_leader] = max(leaders.get(old_leader, 0) - 1, 0)
            members = [r.to_proto() for r in new_refs]
            try:
                await coord.links.assign(
                    leader.address,
                    name,
                    term,
                    coord.config.assign_timeout,
                    replica_set=pb.ReplicaSet(
                        role=LEADER, members=members, leader=leader.to_proto()
                    ),
                )
            except StreamingError as err:
                _failed(log.warning, "assign failed", name, leader.server_id, term, err)
                coord._notify(
                    "assign-failed",
                    name,
                    {"node": leader.server_id, "term": term, "error": str(err)},
                )
                return False
            coord._crash_point(sm.Step.ASSIGN, name)
            followers = [
                r for r in new_refs if r.server_id != leader.server_id and self._assignable(r)
            ]
            await asyncio.gather(
                *(self._assign_follower(name, term, r, leader, members) for r in followers)
            )

            record.meta.node.CopyFrom(leader.to_proto())
            record.meta.CopyFrom(sm.finish_assignment(record.meta))
            record.joint_until = choice.next_offset if previous else 0
            await coord._persist(name, record)
            coord._assigned_at[name] = coord.clock()
            coord._crash_point(sm.Step.PERSIST_ASSIGNED, name)
        if change.reason == "handover" and choice.leader == old_leader:
            self._handover_after[name] = coord.clock() + HANDOVER_BACKOFF
        self._report_done(name, change, before, record, choice)
        return True

    def _assignable(self, node: sm.NodeRef) -> bool:
        return self.coord.tracker.state(node.server_id) == Liveness.LIVE

    async def _assign_follower(
        self,
        name: str,
        term: int,
        node: sm.NodeRef,
        leader: sm.NodeRef,
        members: list[pb.StreamingNodeInfo],
    ) -> bool:
        """Best effort: a follower that fails here rejoins on a later round."""
        self._rejoined_at[(name, node.server_id)] = self.coord.clock()
        try:
            await self.coord.links.assign(
                node.address,
                name,
                term,
                min(self.coord.config.assign_timeout, 2.0),
                replica_set=pb.ReplicaSet(role=FOLLOWER, members=members, leader=leader.to_proto()),
            )
            return True
        except StreamingError as err:
            _failed(log.info, "follower assign failed", name, node.server_id, term, err)
            return False

    def _report_done(
        self,
        name: str,
        change: rs.TermChange,
        before: cpb.ChannelRecord,
        after: cpb.ChannelRecord,
        choice: lc.Choice,
    ) -> None:
        old_leader = before.meta.node.server_id if before.members else None
        fields = {
            "pchannel": name,
            "reason": change.reason,
            "old_node": old_leader,
            "new_node": choice.leader,
            "old_term": before.meta.channel.term,
            "new_term": after.meta.channel.term,
            "members": list(member_ids(after)),
            "next_offset": choice.next_offset,
        }
        self.coord.metrics.reassignments.labels(change.reason).inc()
        self.coord._report_assigned(name, change.reason, fields)

    # ----------------------------------------------------------------- rejoin, joint

    async def _rejoin(self, name: str, nodes: tuple[int, ...]) -> None:
        """Assign returning members as followers under the current term (they cut any
        divergent suffix themselves, from the leader's term history)."""
        async with self.coord._lock(name):
            stored = self.coord._records.get(name)
            if stored is None or stored.record.meta.state != sm.ASSIGNED:
                return
            record = stored.record
            meta = record.meta
            leader = sm.NodeRef.from_proto(meta.node)
            members = list(record.members)
            done = await asyncio.gather(
                *(
                    self._assign_follower(
                        name, meta.channel.term, self._ref(n, record), leader, members
                    )
                    for n in nodes
                    if n != leader.server_id
                )
            )
        if any(done):
            log.info(
                "followers rejoined",
                extra={"pchannel": name, "term": meta.channel.term, "nodes": list(nodes)},
            )

    async def _complete_joint(self, name: str) -> None:
        """Drop the previous set once every member holds the log up to the change point."""
        async with self.coord._lock(name):
            stored = self.coord._records.get(name)
            if stored is None or not stored.record.previous_members:
                return
            record = stored.record
            status = self.leader_status(record)
            if status is None:
                return
            acked = {p.node_id: p.acked_offset for p in status.replicas}
            if not rs.joint_complete(
                member_ids(record), record.meta.node.server_id, record.joint_until, acked
            ):
                return
            out = cpb.ChannelRecord()
            out.CopyFrom(record)
            del out.previous_members[:]
            out.joint_until = 0
            with suppress(VersionConflict):
                await self.coord._persist(name, out)
                log.info(
                    "replica set change complete",
                    extra={"pchannel": name, "members": list(member_ids(out))},
                )

    # ----------------------------------------------------------------- describe

    def describe(self, record: cpb.ChannelRecord, out: cpb.ChannelDescription) -> None:
        """Fill the replication part of a description from the record and the leader."""
        out.replicas = max(record.replicas, 1)
        out.members.extend(record.members)
        status = self.leader_status(record)
        if status is not None:
            out.progress.extend(status.replicas)
            out.next_offset = status.next_offset
            out.commit_offset = status.commit_offset
