"""The coord's driver: runs the pure state machine and balancer against nodes and a store.

Two loops, both bounded in time:

- the probe loop calls CollectStatus on every node each `probe_interval` (deadline: the
  interval) and feeds the LivenessTracker; node joins and losses wake the reconciler;
- the reconcile loop (woken by probes, user requests and a 1 s timer) resumes ASSIGNING
  pchannels, places new ones, fails over those of lost nodes, removes channels a node
  serves but must not (stale terms, destroyed channels), and rebalances at most
  `max_moves_per_round` pchannels when a node joins, a drain changes, or the rebalance
  timer fires.

All decisions come from `state_machine` and `balancer`; this module only sequences I/O.
Every meta change goes through `_persist`, which writes the meta store first and only then
updates the in-memory view that AssignmentDiscover publishes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from streamwal.coord import balancer, catch_up
from streamwal.coord import state_machine as sm
from streamwal.coord.broadcaster import Broadcaster
from streamwal.coord.discovery import AssignmentHub
from streamwal.coord.liveness import Liveness, LivenessTracker
from streamwal.coord.meta_store import MetaStore, Stored, VersionConflict, check_name
from streamwal.coord.metrics import CoordMetrics
from streamwal.coord.node_link import NodeLinks
from streamwal.coord.replication import ReplicationDriver, is_replicated, member_ids
from streamwal.errors import ChannelNotExist, Code, Inner, InvalidArgument, StreamingError
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb
from streamwal.tasks import cancel_and_wait

log = logging.getLogger("streamwal.coord")

# Outcome listener: (kind, pchannel, fields); kinds: assigned, failover, assign-failed,
# unavailable. The operator turns these into Kubernetes Events and status conditions.
Listener = Callable[[str, str, dict], None]

MAX_CREATE = 1024
MAX_REPLICAS = 9
CRASH_ENV = "STREAMWAL_COORD_CRASH_AT"


@dataclass
class CoordConfig:
    """How the coord watches nodes and moves channels."""

    nodes: dict[int, str]
    probe_interval: float = 0.5
    grace: float = 1.5
    max_moves_per_round: int = 1
    tolerance: int = 1
    rebalance_interval: float = 30.0
    assign_timeout: float = 5.0
    remove_timeout: float = 1.0
    fence_timeout: float = 2.0  # replicated term changes: how long Fence answers are awaited
    max_clock_offset: float = 0.5  # seconds; a node farther off leads nothing
    # Test-only crash injection: SIGKILL self right after this step (see Step values).
    crash_at: str | None = field(default_factory=lambda: os.environ.get(CRASH_ENV) or None)


class Coordinator:
    """Owns the pchannel metas of one meta store; exactly one runs per store."""

    def __init__(
        self,
        store: MetaStore,
        config: CoordConfig,
        links: NodeLinks | None = None,
        metrics: CoordMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config
        self.links = links or NodeLinks()
        self.metrics = metrics or CoordMetrics()
        self.clock = clock
        self.tracker = LivenessTracker(config.probe_interval, config.grace)
        self.hub = AssignmentHub(0)
        self._records: dict[str, Stored] = {}
        self._cluster = cpb.ClusterRecord()
        self._cluster_version: str | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._status: dict[int, tuple[float, list[pb.PChannelInfo]]] = {}
        self._assigned_at: dict[str, float] = {}
        self._lost_at: dict[int, float] = {}
        self._failed_target: dict[str, int] = {}
        # Single-replica pchannels whose only copy lost acknowledged records: why. They
        # are left alone (a move would copy the damaged log) until accept_data_loss.
        self._data_loss: dict[str, str] = {}
        self._accepting: set[str] = set()
        # Nodes whose wall clock is farther than max_clock_offset from ours: offset (s).
        self.skewed: dict[int, float] = {}
        # Catch-up on moves: the node holding a moving channel's records (kept from the
        # start of the move to its ASSIGNED), and the highest end of log probes reported.
        self._holder: dict[str, sm.NodeRef] = {}
        self._seen_next: dict[str, int] = {}
        self._last_plan: dict[str, catch_up.CatchUpPlan] = {}
        self._recheck: set[str] = set()
        self._rebalance_due = True
        self._next_rebalance = 0.0
        self._wake = asyncio.Event()
        self._first_probe = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        # Seams for drivers that share the store with others (the Kubernetes operator):
        # `active` False skips reconcile rounds (a standby replica), `listener` hears outcomes.
        self.active = True
        self.listener: Listener | None = None
        self.broadcaster = Broadcaster(self)
        self.replication = ReplicationDriver(self)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load the store, take a new incarnation, and start probing and reconciling."""
        cluster, version = await self.store.get_cluster()
        cluster.incarnation += 1
        self._cluster_version = await self.store.put_cluster(cluster, version)
        self._cluster = cluster
        self.hub = AssignmentHub(cluster.incarnation)
        self._records = {s.name: s for s in await self.store.list_channels()}
        for name, stored in self._records.items():
            self.metrics.set_channel(None if stored.record.destroyed else stored.record.meta, name)
        self.hub.update(self._metas().values())
        now = self.clock()
        for node in self.config.nodes:
            self.tracker.track(node, now)
        self._next_rebalance = now + self.config.rebalance_interval
        log.info(
            "coord started",
            extra={
                "incarnation": cluster.incarnation,
                "channels": len(self._metas()),
                "nodes": self.config.nodes,
            },
        )
        await self.broadcaster.start()
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name="coord-probe"),
            asyncio.create_task(self._reconcile_loop(), name="coord-reconcile"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.broadcaster.stop()
        self.hub.close_all()
        await self.links.close()

    @property
    def incarnation(self) -> int:
        return self._cluster.incarnation

    def wake(self) -> None:
        self._wake.set()

    def _notify(self, kind: str, name: str, fields: dict) -> None:
        if self.listener is not None:
            try:
                self.listener(kind, name, fields)
            except Exception:
                log.exception("listener failed", extra={"pchannel": name, "kind": kind})

    def set_nodes(self, nodes: dict[int, str]) -> None:
        """Replace the node set (the operator discovers nodes from pods as they come and go).

        A node that leaves the set is no longer probed nor alive, so its channels fail over on
        the next round; a new node is tracked and probed before it gets channels.
        """
        if nodes == self.config.nodes:
            return
        now = self.clock()
        for node in set(self.config.nodes) - set(nodes):
            self.tracker.forget(node)
            self._status.pop(node, None)
            self.replication.forget(node)
            self._lost_at[node] = now
        for node in nodes:
            self.tracker.track(node, now)
        self.config.nodes = dict(nodes)
        log.info("node set changed", extra={"nodes": self.config.nodes})
        self._rebalance_due = True
        self.wake()

    async def refresh(self) -> None:
        """Re-read the store: pick up channels created, changed or deleted by others.

        Channels being worked on (their lock held) are skipped: replacing their record under
        a running reassignment would let it write over a newer version.
        """
        stored = {s.name: s for s in await self.store.list_channels()}
        changed = False
        for name in set(self._records) | set(stored):
            if self._lock(name).locked():
                continue
            old, new = self._records.get(name), stored.get(name)
            if old is not None and new is not None and old.version == new.version:
                continue
            changed = True
            if new is None:
                del self._records[name]
                self.metrics.set_channel(None, name)
            else:
                self._records[name] = new
                self.metrics.set_channel(None if new.record.destroyed else new.record.meta, name)
        if changed:
            if self.hub.update(self._metas().values()):
                self.metrics.assignment_changes.inc()
            self.wake()

    async def touch(self, name: str) -> None:
        """Write a channel's record unchanged, so a store can refresh what it derives."""
        async with self._lock(name):
            stored = self._records.get(name)
            if stored is not None:
                record = cpb.ChannelRecord()
                record.CopyFrom(stored.record)
                await self._persist(name, record)

    # ----------------------------------------------------------------- queries

    def _metas(self) -> dict[str, pb.PChannelMeta]:
        return {n: s.record.meta for n, s in self._records.items() if not s.record.destroyed}

    def _node(self, server_id: int) -> sm.NodeRef:
        return sm.NodeRef(server_id, self.config.nodes[server_id])

    def drained(self) -> set[int]:
        return set(self._cluster.drained_nodes)

    def avoided(self) -> set[int]:
        """Nodes that take no new pchannels and hand over what they lead: drained ones,
        and those whose clock is too far off (time ticks would run ahead there)."""
        return self.drained() | set(self.skewed)

    def describe(self, names: list[str]) -> list[cpb.ChannelDescription]:
        """Descriptions of `names` (all live channels when empty); unknown names raise."""
        live = {n: s for n, s in self._records.items() if not s.record.destroyed}
        wanted = names or sorted(live)
        missing = [n for n in wanted if n not in live]
        if missing:
            raise ChannelNotExist(f"no such pchannel: {', '.join(missing)}")
        out = []
        for n in wanted:
            record = live[n].record
            description = cpb.ChannelDescription(
                channel_name=n,
                owner=record.owner,
                meta=record.meta,
                data_loss=self._data_loss.get(n, ""),
            )
            self.replication.describe(record, description)
            out.append(description)
        return out

    def nodes(self) -> list[cpb.NodeDescription]:
        load = balancer.loads(
            {n: m.node.server_id for n, m in self._metas().items() if m.state == sm.ASSIGNED},
            self.config.nodes,
        )
        return [
            cpb.NodeDescription(
                node=self._node(n).to_proto(),
                liveness=self.tracker.state(n).value,
                drained=n in self.drained(),
                channels=load.get(n, 0),
            )
            for n in sorted(self.config.nodes)
        ]

    # ----------------------------------------------------------------- user requests

    async def create_channels(
        self, owner: cpb.OwnerDescription, count: int, prefix: str = "", replicas: int = 1
    ) -> list[str]:
        """Persist `count` new UNINITIALIZED pchannels named <prefix>_<n>; names never repeat.

        `replicas` (0 reads as 1): copies of each log, on distinct nodes; odd, so that a
        majority quorum exists (the PChannel CRD has the same rule)."""
        if not 1 <= count <= MAX_CREATE:
            raise InvalidArgument(f"num_channels must be in 1..{MAX_CREATE}, got {count}")
        replicas = replicas or 1
        if not (1 <= replicas <= MAX_REPLICAS and replicas % 2 == 1):
            raise InvalidArgument(f"replicas must be odd (1, 3, 5, 7 or 9), got {replicas}")
        prefix = check_name(prefix or "pchannel")
        head = prefix + "_"
        used = {
            int(n[len(head) :])
            for n in self._records
            if n.startswith(head) and n[len(head) :].isdigit()
        }
        names, index = [], 0
        while len(names) < count:
            if index not in used:
                names.append(check_name(f"{prefix}_{index}"))
            index += 1
        now_ms = int(time.time() * 1000)
        for name in names:
            record = cpb.ChannelRecord(
                meta=sm.new_channel(name), owner=owner, created_at_ms=now_ms, replicas=replicas
            )
            await self._persist(name, record)
        log.info(
            "channels created", extra={"channels": names, "role": owner.role, "replicas": replicas}
        )
        self.wake()
        return names

    async def destroy_channels(self, names: list[str]) -> None:
        """Tombstone the channels (persisted first), then remove them from their node."""
        self.describe(names or ["<none>"])  # raises on unknown names
        for name in names:
            async with self._lock(name):
                record = cpb.ChannelRecord()
                record.CopyFrom(self._records[name].record)
                record.destroyed = True
                await self._persist(name, record)
            node = sm.owner(record.meta)
            holders = set(member_ids(record)) | ({node.server_id} if node else set())
            for holder in sorted(holders & set(self.config.nodes)):
                with suppress(StreamingError):
                    await self.links.remove(
                        self.config.nodes[holder],
                        name,
                        record.meta.channel.term,
                        self.config.remove_timeout,
                    )
        log.info("channels destroyed", extra={"channels": names})
        self.wake()

    async def drain(self, server_id: int, undrain: bool = False) -> None:
        if server_id not in self.config.nodes:
            raise InvalidArgument(f"unknown node {server_id}")
        drained = self.drained()
        drained = drained - {server_id} if undrain else drained | {server_id}
        record = cpb.ClusterRecord()
        record.CopyFrom(self._cluster)
        del record.drained_nodes[:]
        record.drained_nodes.extend(sorted(drained))
        self._cluster_version = await self.store.put_cluster(record, self._cluster_version)
        self._cluster = record
        log.info("node drain changed", extra={"node": server_id, "drained": not undrain})
        self._rebalance_due = True
        self.wake()

    async def accept_data_loss(self, name: str) -> None:
        """Serve a single-replica pchannel whose only copy lost acknowledged records: its
        holder takes a new term above every offset it acknowledged (the node refuses
        nothing else). Only for a pchannel reported as lost (describe's data_loss)."""
        stored = self._records.get(name)
        if stored is None or stored.record.destroyed:
            raise ChannelNotExist(f"no such pchannel: {name}")
        if name not in self._data_loss:
            raise InvalidArgument(f"pchannel {name!r} has no data loss to accept")
        holder = catch_up.data_holder(stored.record.meta, self._holder.get(name))
        if holder is None:
            raise InvalidArgument(f"pchannel {name!r}: no node holds its log")
        self._accepting.add(name)
        try:
            for _ in range(3):  # a status write racing ours (the operator) is retried
                if await self._reassign(name, holder, "accept-data-loss"):
                    break
                await self.refresh()
            else:
                raise Inner(f"accepting the loss of {name!r} failed: see the coord's log")
        finally:
            self._accepting.discard(name)
        log.warning("data loss accepted", extra={"pchannel": name, "node": holder.server_id})
        self._data_loss.pop(name, None)

    def report_error(self, info: pb.PChannelInfo, err: pb.StreamingError) -> None:
        """A client hit an error on `info`: re-check that pchannel on the next round, now."""
        meta = self._metas().get(info.name)
        if meta is None or info.term < meta.channel.term:
            return  # unknown, or the client's view is older than ours: it will get ours
        log.info(
            "assignment error reported",
            extra={"pchannel": info.name, "term": info.term, "code": err.code},
        )
        self._recheck.add(info.name)
        self.wake()

    # ----------------------------------------------------------------- persistence

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _persist(self, name: str, record: cpb.ChannelRecord) -> None:
        """Write the store first; then update the view, metrics and the published versions."""
        previous = self._records.get(name)
        try:
            stored = await self.store.put_channel(record, previous.version if previous else None)
        except VersionConflict:
            # Someone else wrote it: take their version; the caller's round decides again.
            fresh = await self.store.get_channel(name)
            if fresh is None:
                self._records.pop(name, None)
            else:
                self._records[name] = fresh
            raise
        self._records[name] = stored
        self.metrics.set_channel(None if record.destroyed else record.meta, name)
        if self.hub.update(self._metas().values()):
            self.metrics.assignment_changes.inc()

    async def _persist_meta(self, name: str, meta: pb.PChannelMeta) -> None:
        record = cpb.ChannelRecord()
        record.CopyFrom(self._records[name].record)
        record.meta.CopyFrom(meta)
        await self._persist(name, record)

    def _crash_point(self, step: sm.Step, name: str) -> None:
        if self.config.crash_at == step.value:
            log.warning("crash injected", extra={"step": step.value, "pchannel": name})
            os.kill(os.getpid(), signal.SIGKILL)

    # ----------------------------------------------------------------- reassignment

    async def _reassign(self, name: str, target: sm.NodeRef | None, reason: str) -> bool:
        """Run one (re)assignment of `name` to `target` (None: resume the persisted one)."""
        async with self._lock(name):
            stored = self._records.get(name)
            if stored is None or stored.record.destroyed:
                return False
            before = stored.record.meta
            previous = sm.owner(before)
            holder = catch_up.data_holder(before, self._holder.get(name))
            if holder is not None:
                self._holder[name] = holder
            try:
                if target is not None:
                    meta = sm.begin_assignment(before, target)
                    await self._persist_meta(name, meta)
                    self._crash_point(sm.Step.PERSIST_ASSIGNING, name)
                if not await self._drive(name):
                    return False
            except VersionConflict as err:
                log.info(
                    "meta changed by another writer", extra={"pchannel": name, "error": str(err)}
                )
                return False
            after = self._records[name].record.meta
            self._failed_target.pop(name, None)
            self._holder.pop(name, None)
            self.metrics.reassignments.labels(reason).inc()
            fields = {
                "pchannel": name,
                "reason": reason,
                "old_node": previous.server_id if previous else None,
                "new_node": after.node.server_id,
                "old_term": before.channel.term,
                "new_term": after.channel.term,
            }
            plan = self._last_plan.pop(name, None)
            if plan is not None:
                fields["catch_up_from"] = plan.catch_up_from or None
                fields["unclean"] = plan.unclean
            self._report_assigned(name, reason, fields)
            return True

    def _report_assigned(self, name: str, reason: str, fields: dict) -> None:
        """Log and announce a finished (re)assignment; a failover with its duration since
        its old node (`fields["old_node"]`) was declared lost."""
        old_node = fields.get("old_node")
        lost_at = self._lost_at.get(old_node) if old_node is not None else None
        if reason == "failover" and lost_at is not None:
            seconds = self.clock() - lost_at
            self.metrics.failovers.inc()
            self.metrics.failover_duration.observe(seconds)
            fields["since_detection_s"] = round(seconds, 3)
            log.info("failover done", extra=fields)
        else:
            log.info("pchannel assigned", extra=fields)
        self._notify("failover" if reason == "failover" else "assigned", name, fields)

    async def _drive(self, name: str) -> bool:
        """Execute the steps the persisted meta still needs; False if Assign failed."""
        meta = self._records[name].record.meta
        for action in sm.next_actions(meta):
            if isinstance(action, sm.RemoveOld):
                await self._remove_best_effort(action)
            elif isinstance(action, sm.AssignNew):
                plan = self._last_plan[name] = self._catch_up_plan(name, meta, action.node)
                try:
                    await self.links.assign(
                        action.node.address,
                        name,
                        action.term,
                        self.config.assign_timeout,
                        catch_up_from=plan.catch_up_from,
                        min_next_offset=plan.min_next_offset,
                        accept_data_loss=name in self._accepting,
                    )
                except StreamingError as err:
                    if err.code == Code.STREAMING_CODE_DATA_LOSS:
                        await self._data_lost(name, str(err))
                        return False
                    log.warning(
                        "assign failed",
                        extra={
                            "pchannel": name,
                            "node": action.node.server_id,
                            "term": action.term,
                            "error": str(err),
                        },
                    )
                    self._failed_target[name] = action.node.server_id
                    self._notify(
                        "assign-failed",
                        name,
                        {"node": action.node.server_id, "term": action.term, "error": str(err)},
                    )
                    return False
                if plan.unclean:
                    self._report_unclean(name, action, plan)
            else:
                await self._persist_meta(name, action.meta)
                self._assigned_at[name] = self.clock()
            self._crash_point(action.step, name)
        return True

    async def _data_lost(self, name: str, cause: str) -> None:
        """The only copy of `name` lost acknowledged records: stop moving it (a copy of the
        damaged log would only hide the loss), say so once, wait for accept_data_loss."""
        if name in self._data_loss:
            return
        self._data_loss[name] = cause
        meta = self._records[name].record.meta
        if meta.state != sm.UNAVAILABLE:
            await self._persist_meta(name, sm.mark_unavailable(meta))
        log.error("pchannel lost acknowledged records", extra={"pchannel": name, "cause": cause})
        self._notify("data-loss", name, {"cause": cause})

    def _catch_up_plan(
        self, name: str, meta: pb.PChannelMeta, target: sm.NodeRef
    ) -> catch_up.CatchUpPlan:
        holder = catch_up.data_holder(meta, self._holder.get(name))
        lost = holder is not None and (
            holder.server_id not in self.config.nodes
            or self.tracker.state(holder.server_id) == Liveness.LOST
        )
        return catch_up.plan(holder, target, lost, self._seen_next.get(name, 0))

    def _report_unclean(self, name: str, action: sm.AssignNew, plan: catch_up.CatchUpPlan) -> None:
        """A move off a lost node without catch-up: say so loudly (log, metric, listener)."""
        holder = self._holder.get(name)
        fields = {
            "pchannel": name,
            "old_node": holder.server_id if holder else None,
            "new_node": action.node.server_id,
            "new_term": action.term,
            "min_next_offset": plan.min_next_offset,
            "stranded": "records the lost node acknowledged at or after min_next_offset",
        }
        self.metrics.unclean_failovers.inc()
        log.warning(
            "unclean failover",
            extra=fields,
        )
        self._notify("unclean-failover", name, fields)

    async def _remove_best_effort(self, action: sm.RemoveOld) -> None:
        """Remove on a previous owner; a lost node gets a short wait, errors are logged."""
        lost = self.tracker.state(action.node.server_id) == Liveness.LOST
        timeout = min(0.3, self.config.remove_timeout) if lost else self.config.remove_timeout
        try:
            await self.links.remove(action.node.address, action.name, action.term, timeout)
        except StreamingError as err:
            log.info(
                "remove skipped",
                extra={
                    "pchannel": action.name,
                    "node": action.node.server_id,
                    "term": action.term,
                    "error": str(err),
                },
            )

    # ----------------------------------------------------------------- loops

    async def _probe_loop(self) -> None:
        tick = min(0.05, self.config.probe_interval / 4)
        while True:
            due = self.tracker.due(self.clock())
            if due:
                await asyncio.gather(*(self._probe(n) for n in due))
                self._first_probe.set()
            changes = self.tracker.tick(self.clock())
            for change in changes:
                self._on_transition(change.node, change.after)
            self.metrics.nodes_live.set(len(self.tracker.live()))
            await asyncio.sleep(tick)

    async def _probe(self, node: int) -> None:
        started = self.clock()
        ok = False
        address = self.config.nodes.get(node)
        if address is None:
            return  # left the node set since the probe was scheduled
        try:
            sent = time.time()
            status = await self.links.collect_status(address, timeout=self.config.probe_interval)
            self._observe_clock(node, status.wall_time_ms / 1000 - (sent + time.time()) / 2)
            if status.server_id and status.server_id != node:
                log.error("node id mismatch", extra={"node": node, "reported": status.server_id})
            else:
                ok = True
                self._status[node] = (started, [c.pchannel for c in status.channels])
                self.replication.observe(node, started, status.channels)
                for c in status.channels:
                    seen = self._seen_next.get(c.pchannel.name, 0)
                    self._seen_next[c.pchannel.name] = max(seen, c.next_offset)
        except StreamingError:
            pass
        if self.config.nodes.get(node) != address:
            return  # the node left (or moved) while we asked it
        change = self.tracker.observe(node, ok, self.clock())
        if change is not None:
            self._on_transition(node, change.after)
        if ok and self._status_needs_action(node):
            self.wake()

    def _observe_clock(self, node: int, offset: float) -> None:
        """Keep how far a node's clock is from ours; beyond the bound it leads nothing."""
        self.metrics.clock_offset.labels(str(node)).set(offset)
        skewed = abs(offset) > self.config.max_clock_offset
        if skewed and node not in self.skewed:
            log.warning(
                "node clock too far off: it leads nothing until it is back within the bound",
                extra={
                    "node": node,
                    "offset_s": round(offset, 3),
                    "max_s": self.config.max_clock_offset,
                },
            )
            self.wake()
        elif not skewed and node in self.skewed:
            log.info("node clock back within the bound", extra={"node": node})
            self.wake()
        if skewed:
            self.skewed[node] = offset
        else:
            self.skewed.pop(node, None)

    def _on_transition(self, node: int, after: Liveness) -> None:
        log.info("node liveness changed", extra={"node": node, "liveness": after.value})
        if after == Liveness.LOST:
            self._lost_at[node] = self.clock()
            self._status.pop(node, None)
        if after == Liveness.LIVE:
            self._rebalance_due = True
        self.wake()

    def _status_needs_action(self, node: int) -> bool:
        started, served = self._status[node]
        metas = self._metas()
        if sm.stale_channels(node, served, metas, self.replication.members_by_channel()):
            return True
        if any(
            node in self.replication.missing(s.record)
            for s in self._replicated().values()
            if s.record.meta.state == sm.ASSIGNED
        ):
            return True
        return any(
            self._assigned_at.get(n, 0.0) < started
            for n in sm.missing_channels(node, served, metas)
        )

    async def _reconcile_loop(self) -> None:
        # Wait for one round of probes so the first placement sees every node that is up.
        with suppress(TimeoutError):
            await asyncio.wait_for(self._first_probe.wait(), self.config.grace)
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            try:
                await self.reconcile_once()
            except StreamingError as err:  # e.g. the meta store cannot be written now
                log.warning("reconcile round failed", extra={"error": str(err)})
                await asyncio.sleep(0.2)
            except Exception:
                log.exception("reconcile round failed")
                await asyncio.sleep(0.2)

    async def reconcile_once(self) -> None:
        """One round: recover, place, fail over, fence stale copies, then rebalance."""
        if not self.active:
            return
        now = self.clock()
        alive, live, drained = self.tracker.alive(), self.tracker.live(), self.avoided()
        alive &= set(self.config.nodes)
        replicated = self._replicated()
        metas = {
            n: m
            for n, m in self._metas().items()
            if n not in replicated and n not in self._data_loss
        }
        forced = await self._rechecks(metas, live) | self._missing(metas)

        jobs: list[tuple[str, sm.NodeRef | None, str]] = []
        need: dict[str, str] = {}
        for name, meta in metas.items():
            owner = sm.owner(meta)
            owner_alive = owner is not None and owner.server_id in alive
            if name in forced:
                need[name] = "recheck"
            elif meta.state == sm.ASSIGNING and owner_alive and name not in self._failed_target:
                jobs.append((name, None, "resume"))
            elif meta.state == sm.ASSIGNING or sm.needs_assignment(meta, alive):
                need[name] = "placement" if meta.state == sm.UNINITIALIZED else "failover"

        placement = {
            n: m.node.server_id
            for n, m in self._metas().items()
            if n not in need
            and m.state in (sm.ASSIGNED, sm.ASSIGNING)
            and m.node.server_id in alive
        }
        for name in sorted(need):
            failed = self._failed_target.get(name)
            candidates = live - {failed} if live - {failed} else live
            targets = balancer.place([name], placement, candidates, drained)
            if name not in targets:
                # Nowhere to go now; the channel waits (and says so) until a node is live.
                await self._mark_unavailable_if_orphaned(name, alive)
                continue
            placement[name] = targets[name]
            jobs.append((name, self._node(targets[name]), need[name]))
        await asyncio.gather(
            *(self._reassign(n, t, r) for n, t, r in jobs),
            self.replication.reconcile(replicated, alive, live, drained),
        )

        await self._fence_stale()

        if now >= self._next_rebalance:
            self._rebalance_due = True
            self._next_rebalance = now + self.config.rebalance_interval
        if self._rebalance_due:
            self._rebalance_due = False
            await self._rebalance(live, drained)

    async def _mark_unavailable_if_orphaned(self, name: str, alive: set[int]) -> None:
        async with self._lock(name):
            stored = self._records.get(name)
            if stored is None or stored.record.destroyed:
                return
            meta = stored.record.meta
            owner = sm.owner(meta)
            if meta.state in (sm.ASSIGNED, sm.ASSIGNING) and (
                owner is None or owner.server_id not in alive
            ):
                await self._persist_meta(name, sm.mark_unavailable(meta))
                log.warning("pchannel unavailable: no live node", extra={"pchannel": name})
                self._notify("unavailable", name, {"node": owner.server_id if owner else None})

    async def _rechecks(self, metas: dict[str, pb.PChannelMeta], live: set[int]) -> set[str]:
        """Channels reported by clients whose owner answers but does not serve them now.

        An owner that does not answer is left to liveness: it either comes back (then its
        channels move, or are re-assigned, with catch-up from it) or is declared LOST after
        the grace period (failover). Moving at once would have to leave its records behind.
        """
        names, self._recheck = self._recheck, set()
        out: set[str] = set()
        for name in sorted(names):
            meta = metas.get(name)
            if meta is None or meta.state != sm.ASSIGNED:
                continue
            try:
                status = await self.links.collect_status(
                    meta.node.address, timeout=self.config.probe_interval
                )
                served = {(c.pchannel.name, c.pchannel.term) for c in status.channels}
                if (name, meta.channel.term) in served:
                    continue
            except StreamingError:
                continue  # unreachable: see the docstring
            out.add(name)
        return out

    def _replicated(self) -> dict[str, Stored]:
        """Live replicated pchannels: `replication` drives them, not the single-replica path."""
        return {
            n: s
            for n, s in self._records.items()
            if not s.record.destroyed and is_replicated(s.record)
        }

    def _missing(self, metas: dict[str, pb.PChannelMeta]) -> set[str]:
        """ASSIGNED channels whose live owner, probed after the assignment, does not serve them."""
        out: set[str] = set()
        for node, (started, served) in self._status.items():
            for name in sm.missing_channels(node, served, metas):
                if self._assigned_at.get(name, 0.0) < started:
                    out.add(name)
        return out

    async def _fence_stale(self) -> None:
        """Remove every (channel, term) a node serves without owning it at that term."""
        metas = self._metas()
        members = self.replication.members_by_channel()
        calls = []
        for node, (started, served) in list(self._status.items()):
            stale = sm.stale_channels(node, served, metas, members)
            for info in stale:
                calls.append(
                    self._remove_best_effort(sm.RemoveOld(self._node(node), info.name, info.term))
                )
            # Fenced once per observation; the next probe shows whether it worked.
            self._status[node] = (started, [i for i in served if i not in stale])
        if calls:
            log.info("fencing stale pchannels", extra={"count": len(calls)})
            await asyncio.gather(*calls)

    async def _rebalance(self, live: set[int], drained: set[int]) -> None:
        # Replicated pchannels are not moved here: a drained or lost member is replaced by
        # a term change of `replication`, which prefers an up-to-date follower as leader.
        replicated = self._replicated()
        placement = {
            n: m.node.server_id
            for n, m in self._metas().items()
            if m.state == sm.ASSIGNED and m.node.server_id in live and n not in replicated
        }
        moves = balancer.rebalance(
            placement, live, drained, self.config.max_moves_per_round, self.config.tolerance
        )
        if moves:
            log.info(
                "rebalancing", extra={"moves": [(m.channel, m.source, m.target) for m in moves]}
            )
            await asyncio.gather(
                *(self._reassign(m.channel, self._node(m.target), "rebalance") for m in moves)
            )
