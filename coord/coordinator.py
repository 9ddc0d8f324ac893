"""The coord's driver: observes nodes, plans rounds, runs them. Decisions live elsewhere.

Two loops, both bounded in time:

- the probe loop calls CollectStatus on every node each `probe_interval` (deadline: the
  interval) and feeds the LivenessTracker and the coord's `Memory`; node joins and
  losses, and reports that ask for action (`planner.needs_action`), wake the reconciler;
- the reconcile loop (woken by probes, user requests and a 1 s timer) runs rounds: it
  confirms the pchannels clients reported with their owner, asks the pure planner for
  the round's jobs (`planner.plan`), and hands them to the executor, which runs each
  job's saga (`sagas`) step by step under the pchannel's lock. A round plans only the
  pchannels something changed about (`_take_dirty`): its cost follows the change.

Records live in `ChannelRecords` (persisted before anything acts on them); what the coord
knows besides them (probe reports, notes on its own work) in `Memory`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from types import MappingProxyType

from streamwal.coord import balancer, catch_up, sagas
from streamwal.coord import planner as pl
from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.coord.broadcaster import Broadcaster
from streamwal.coord.channel_records import ChannelRecords
from streamwal.coord.discovery import AssignmentHub
from streamwal.coord.executor import Executor, Links, Listener, StepHook
from streamwal.coord.liveness import (
    DEFAULT_GRACE,
    DEFAULT_PROBE_INTERVAL,
    Liveness,
    LivenessTracker,
    LossPolicy,
    refused,
)
from streamwal.coord.memory import Memory, NodeReport
from streamwal.coord.meta_store import MetaStore, check_name
from streamwal.coord.metrics import CoordMetrics
from streamwal.coord.node_link import NodeLinks
from streamwal.coord.pinger import Pinger
from streamwal.errors import ChannelNotExist, Inner, InvalidArgument, StreamingError
from streamwal.logs import Repeats
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb
from streamwal.tasks import cancel_and_wait

log = logging.getLogger("streamwal.coord")
QUIET_RECHECK_S = 5.0  # a node's report is looked into at least this often (`_check`)
# Every client of a pchannel reports the same error until the next round has acted on it:
# logged once per pchannel, term and code, then with counts.
_REPORTED = Repeats()

MAX_CREATE = 1024
MAX_REPLICAS = 9


@dataclass
class CoordConfig:
    """How the coord watches nodes and moves channels."""

    nodes: dict[int, str]
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    grace: float = DEFAULT_GRACE
    max_moves_per_round: int = 1
    tolerance: int = 1
    rebalance_interval: float = 30.0
    assign_timeout: float = 5.0
    remove_timeout: float = 1.0
    fence_timeout: float = 2.0  # replicated term changes: how long Fence answers are awaited
    max_clock_offset: float = 0.5  # seconds; a node farther off leads nothing
    # Loss declarations (coord/liveness.LossPolicy): at most one per `loss_gap` seconds
    # (None: one grace period), none while more than `max_loss_share` of nodes look dead.
    loss_gap: float | None = None
    max_loss_share: float = 0.55
    # A node whose event loop has not turned for this long fails its pings (alive, but
    # serving nothing).
    max_loop_stall: float = 10.0

    def loss_policy(self) -> LossPolicy:
        gap = self.grace if self.loss_gap is None else self.loss_gap
        return LossPolicy(max_share=self.max_loss_share, gap=gap)


class Coordinator:
    """Owns the pchannel metas of one meta store; exactly one runs per store."""

    def __init__(
        self,
        store: MetaStore,
        config: CoordConfig,
        links: Links | None = None,
        metrics: CoordMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        step_hooks: Sequence[StepHook] | None = None,
        wall: Callable[[], float] = time.time,
        pinger: Pinger | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.links: Links = links or NodeLinks()
        self.metrics = metrics or CoordMetrics()
        self.clock = clock
        self.wall = wall  # seconds since the epoch: compared with the nodes' clocks
        self.tracker = LivenessTracker(config.probe_interval, config.grace, config.loss_policy())
        # The second liveness signal (probe ports pinged from a thread); None: CollectStatus
        # alone (the simulator, whose clock is virtual).
        self.pinger = pinger
        self._held: list[int] = []
        self._down_at: dict[int, float] = {}  # nodes known dead (tracker.down) and since when
        self.records = ChannelRecords(store, self.metrics)
        self.memory = Memory()
        self.executor = Executor(
            self.records,
            self.links,
            self.memory,
            self.metrics,
            clock,
            self._report_assigned,
            self._notify,
            step_hooks,
        )
        self._cluster = cpb.ClusterRecord()
        self._cluster_version: str | None = None
        self._rebalance_due = True
        self._next_rebalance = 0.0
        # What the next round plans (`planner.plan`'s dirty): pchannels flagged by probes
        # and liveness changes, those the last round left unsettled, and (at the round)
        # those whose record changed. A full round (all of them) when what every pchannel
        # depends on changed: the first round, a due rebalance, the avoided nodes, labels,
        # domains, or the live set where labels or domains constrain placement.
        self._dirty: set[str] = set()
        # Per node: (records version, served pchannels, report start) of the last probe
        # whose report needed nothing (`_check`).
        self._quiet: dict[int, tuple[int, tuple, float]] = {}
        self._unsettled: set[str] = set()
        self._full_due = True
        self._last_live: frozenset[int] = frozenset()
        self._wake = asyncio.Event()
        self._first_probe = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        # Seams for drivers that share the store with others (the Kubernetes operator):
        # `active` False skips reconcile rounds (a standby replica), `listener` hears outcomes
        # (kinds: assigned, failover, assign-failed, unclean-failover, unavailable).
        self.active = True
        self.listener: Listener | None = None
        self.draining: set[int] = set()  # nodes being stopped (pods deleted): drained
        self.labels: dict[int, Mapping[str, str]] = {}  # node -> labels (placement)
        self.domains: dict[int, str] = {}  # node -> topology domain (anti-affinity)
        self.broadcaster = Broadcaster(self)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load the store, take a new incarnation, and start probing and reconciling."""
        cluster, version = await self.store.get_cluster()
        cluster.incarnation += 1
        self._cluster_version = await self.store.put_cluster(cluster, version)
        self._cluster = cluster
        await self.records.load(cluster.incarnation)
        now = self.clock()
        for node in self.config.nodes:
            self.tracker.track(node, now)
        self._next_rebalance = now + self.config.rebalance_interval
        log.info(
            "coord started",
            extra={
                "incarnation": cluster.incarnation,
                "channels": len(self.records.metas()),
                "nodes": self.config.nodes,
            },
        )
        await self.broadcaster.start()
        if self.pinger is not None:
            self.pinger.start()
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name="coord-probe"),
            asyncio.create_task(self._reconcile_loop(), name="coord-reconcile"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self.pinger is not None:
            await asyncio.to_thread(self.pinger.stop)
        await self.broadcaster.stop()
        self.hub.close_all()
        await self.links.close()

    @property
    def incarnation(self) -> int:
        return self._cluster.incarnation

    @property
    def hub(self) -> AssignmentHub:
        """What AssignmentDiscover publishes (kept by the records: persisted first)."""
        return self.records.hub

    def wake(self) -> None:
        self._wake.set()

    def _notify(self, kind: str, name: str, fields: dict) -> None:
        if self.listener is not None:
            try:
                self.listener(kind, name, fields)
            except Exception:
                log.exception("listener failed", extra={"pchannel": name, "kind": kind})

    def set_nodes(
        self,
        nodes: dict[int, str],
        labels: Mapping[int, Mapping[str, str]] | None = None,
        domains: Mapping[int, str] | None = None,
    ) -> None:
        """Replace the node set (the operator discovers nodes from pods as they come and go).

        A node that leaves the set is no longer probed nor alive, so its channels fail over on
        the next round; a new node is tracked and probed before it gets channels. `labels`
        and `domains` (topology domain per node) are what placement constraints match.
        """
        attrs = (dict(labels or {}), dict(domains or {}))
        if attrs != (self.labels, self.domains):
            self.labels, self.domains = attrs
            self._full_due = True
            self.wake()
        if nodes == self.config.nodes:
            return
        now = self.clock()
        for node in set(self.config.nodes) - set(nodes):
            if self.pinger is not None:
                self.pinger.watch(node, None)
            self.tracker.forget(node)
            self.memory.forget(node)
            self.memory.lost_at[node] = now
        for node in nodes:
            self.tracker.track(node, now)
        self.config.nodes = dict(nodes)
        log.info("node set changed", extra={"nodes": self.config.nodes})
        self._rebalance_due = True
        self.wake()

    async def refresh(self) -> None:
        """Re-read the store: pick up channels created, changed or deleted by others."""
        if await self.records.refresh():
            self.wake()

    async def touch(self, name: str) -> None:
        """Write a channel's record unchanged, so a store can refresh what it derives."""
        async with self.records.lock(name):
            if self.records.get(name) is not None:
                await self.records.persist(name, self.records.copy(name))

    # ----------------------------------------------------------------- queries

    def _node(self, server_id: int) -> sm.NodeRef:
        return sm.NodeRef(server_id, self.config.nodes[server_id])

    def drained(self) -> set[int]:
        return set(self._cluster.drained_nodes)

    @property
    def skewed(self) -> dict[int, float]:
        """Nodes whose wall clock is farther than max_clock_offset from ours: offset (s)."""
        return self.memory.skewed

    def avoided(self) -> set[int]:
        """Nodes that take no new pchannels and hand over what they lead: drained ones,
        those being stopped (`set_draining`), and those whose clock is too far off (time
        ticks would run ahead there)."""
        return self.drained() | self.draining | set(self.skewed)

    def set_draining(self, nodes: set[int]) -> None:
        """Nodes about to stop (the operator: pods being deleted): drained until they
        leave the node set, so that their leaderships move cleanly before they go."""
        if nodes != self.draining:
            log.info("nodes draining", extra={"nodes": sorted(nodes)})
            self.draining = set(nodes)
            self._full_due = True
            self._rebalance_due = True
            self.wake()

    def _single_on_avoided(self) -> bool:
        """Whether a single-replica pchannel is still served by an avoided node (the
        rebalance that moves it off stays due until none is)."""
        avoided = self.avoided()
        return any(
            not rs.is_replicated(s.record)
            and s.record.meta.state == sm.ASSIGNED
            and s.record.meta.node.server_id in avoided
            for s in self.records.all().values()
            if not s.record.destroyed
        )

    def describe(self, names: list[str]) -> list[cpb.ChannelDescription]:
        """Descriptions of `names` (all live channels when empty); unknown names raise."""
        live = {n: s for n, s in self.records.all().items() if not s.record.destroyed}
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
                data_loss=self.memory.data_loss.get(n, ""),
                allow_data_loss=record.allow_data_loss,
                retention=record.retention,
                waiting=""
                if record.meta.state == sm.ASSIGNED
                else self.memory.waiting.get(n)
                or self.memory.unschedulable.get(n, "an assignment is under way"),
            )
            pl.describe_replication(record, self.memory.reports, description)
            out.append(description)
        return out

    def nodes(self) -> list[cpb.NodeDescription]:
        load = balancer.loads(
            {
                n: m.node.server_id
                for n, m in self.records.metas().items()
                if m.state == sm.ASSIGNED
            },
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
        self,
        owner: cpb.OwnerDescription,
        count: int,
        prefix: str = "",
        replicas: int = 1,
        allow_data_loss: bool = False,
        names: Sequence[str] = (),
        retention: pb.RetentionPolicy | None = None,
    ) -> list[str]:
        """Persist new UNINITIALIZED pchannels: exactly `names` when given, else `count`
        named <prefix>_<n>; names never repeat (a destroyed one is not reused either).

        `replicas` (0 reads as 1): copies of each log, on distinct nodes; odd, so that a
        majority quorum exists (the PChannel CRD has the same rule). `allow_data_loss`:
        a single copy on a gone node may move without its records (catch_up.hold).
        `retention`: kept in the record and sent with every Assign of the pchannel."""
        replicas = replicas or 1
        if not (1 <= replicas <= MAX_REPLICAS and replicas % 2 == 1):
            raise InvalidArgument(f"replicas must be odd (1, 3, 5, 7 or 9), got {replicas}")
        if retention is not None and (retention.max_age_ms < 0 or retention.max_bytes < 0):
            raise InvalidArgument("retention bounds must not be negative")
        if names:
            created = self._new_names(names, count, prefix)
        else:
            created = self._numbered_names(count, prefix)
        now_ms = int(self.wall() * 1000)
        # Together: the store writes them in a few flushes (issue 24: one by one, 1,024
        # took longer than the request's deadline).
        await asyncio.gather(
            *(
                self.records.persist(
                    name,
                    cpb.ChannelRecord(
                        meta=sm.new_channel(name),
                        owner=owner,
                        created_at_ms=now_ms,
                        replicas=replicas,
                        allow_data_loss=allow_data_loss,
                        retention=retention,
                    ),
                )
                for name in created
            )
        )
        log.info(
            "channels created",
            extra={"channels": created, "role": owner.role, "replicas": replicas},
        )
        self.wake()
        return created

    def _new_names(self, names: Sequence[str], count: int, prefix: str) -> list[str]:
        """`names` checked: plain, distinct, never used before, and not mixed with the
        numbered form."""
        if count or prefix:
            raise InvalidArgument("give either names or num_channels/prefix, not both")
        if len(names) > MAX_CREATE:
            raise InvalidArgument(f"at most {MAX_CREATE} names at once, got {len(names)}")
        wanted = [check_name(n) for n in names]
        if len(set(wanted)) != len(wanted):
            raise InvalidArgument("a name is given twice")
        known = self.records.all()
        taken = [n for n in wanted if n in known]
        if taken:
            gone = [n for n in taken if known[n].record.destroyed]
            why = " (destroyed names are never reused)" if gone else ""
            raise InvalidArgument(f"pchannel already exists: {', '.join(taken)}{why}")
        return wanted

    def _numbered_names(self, count: int, prefix: str) -> list[str]:
        if not 1 <= count <= MAX_CREATE:
            raise InvalidArgument(f"num_channels must be in 1..{MAX_CREATE}, got {count}")
        prefix = check_name(prefix or "pchannel")
        head = prefix + "_"
        used = {
            int(n[len(head) :])
            for n in self.records.all()
            if n.startswith(head) and n[len(head) :].isdigit()
        }
        names: list[str] = []
        index = 0
        while len(names) < count:
            if index not in used:
                names.append(check_name(f"{prefix}_{index}"))
            index += 1
        return names

    async def destroy_channels(self, names: list[str]) -> None:
        """Tombstone the channels (persisted first), then remove them from their node."""
        self.describe(names or ["<none>"])  # raises on unknown names
        removes = []
        for name in names:
            async with self.records.lock(name):
                record = self.records.copy(name)
                record.destroyed = True
                await self.records.persist(name, record)
            node = sm.owner(record.meta)
            holders = set(rs.member_ids(record)) | ({node.server_id} if node else set())
            for holder in sorted(holders & set(self.config.nodes)):
                address, term = self.config.nodes[holder], record.meta.channel.term
                removes.append(self.links.remove(address, name, term, self.config.remove_timeout))
        # together: each node gets its removes in one batch (coord/node_link.py)
        for outcome in await asyncio.gather(*removes, return_exceptions=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, StreamingError):
                raise outcome  # a node that did not answer is fine (fenced later); a bug is not
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
        stored = self.records.get(name)
        if stored is None or stored.record.destroyed:
            raise ChannelNotExist(f"no such pchannel: {name}")
        if name not in self.memory.data_loss:
            raise InvalidArgument(f"pchannel {name!r} has no data loss to accept")
        holder = catch_up.data_holder(stored.record.meta, self.memory.holders.get(name))
        if holder is None:
            raise InvalidArgument(f"pchannel {name!r}: no node holds its log")
        for _ in range(3):  # a status write racing ours (the operator) is retried
            stored = self.records.get(name) or stored
            job = pl.Reassign(name, stored.version, holder, "accept-data-loss", True)
            done = await self.executor.run_job(job, self._round(self._observe_liveness(), {}))
            if isinstance(done, sagas.Assigned):
                break
            await self.refresh()
        else:
            raise Inner(f"accepting the loss of {name!r} failed: see the coord's log")
        log.warning("data loss accepted", extra={"pchannel": name, "node": holder.server_id})
        self.memory.data_loss.pop(name, None)

    def report_error(self, info: pb.PChannelInfo, err: pb.StreamingError) -> None:
        """A client hit an error on `info`: re-check that pchannel on the next round, now."""
        meta = self.records.metas().get(info.name)
        if meta is None or info.term < meta.channel.term:
            return  # unknown, or the client's view is older than ours: it will get ours
        _REPORTED.log(
            log,
            logging.INFO,
            "assignment error reported",
            (info.name, info.term, err.code),
            pchannel=info.name,
            term=info.term,
            code=err.code,
        )
        self.memory.recheck.add(info.name)
        self.wake()

    # ----------------------------------------------------------------- outcomes

    def _report_assigned(self, name: str, done: sagas.Assigned) -> None:
        """Log and announce a finished (re)assignment; a failover with its duration since
        its old node (`fields["old_node"]`) was declared lost."""
        fields = dict(done.fields)
        old_node = fields.get("old_node")
        lost_at = (
            self._down_at.get(old_node, self.memory.lost_at.get(old_node))
            if old_node is not None
            else None
        )
        if done.reason == "failover" and lost_at is not None:
            seconds = self.clock() - lost_at
            self.metrics.failovers.inc()
            self.metrics.failover_duration.observe(seconds)
            fields["since_detection_s"] = round(seconds, 3)
            log.info("failover done", extra=fields)
        else:
            log.info("pchannel assigned", extra=fields)
        self._notify("failover" if done.reason == "failover" else "assigned", name, fields)

    # ----------------------------------------------------------------- loops

    async def _probe_loop(self) -> None:
        tick = min(0.05, self.config.probe_interval / 4)
        while True:
            try:
                await self._probe_round()
            except Exception:  # a bug must not end liveness for good (no probe, no failover)
                log.exception("probe round failed")
            await asyncio.sleep(tick)

    async def _probe_round(self) -> None:
        due = self.tracker.due(self.clock())
        if due:
            await asyncio.gather(*(self._probe(n) for n in due))
            self._first_probe.set()
        now = self.clock()
        self._feed_pings(now)
        changes = self.tracker.tick(now)
        for change in changes:
            self._on_transition(change.node, change.after)
        self._log_held(now)
        self.metrics.nodes_live.set(len(self.tracker.live()))

    async def _probe(self, node: int) -> None:
        started = self.clock()
        ok = gone = False
        address = self.config.nodes.get(node)
        if address is None:
            return  # left the node set since the probe was scheduled
        try:
            sent = self.wall()
            status = await self.links.collect_status(address, timeout=self.config.probe_interval)
            got = self.wall()
            self._observe_clock(
                node, status.wall_time_ms / 1000 - (sent + got) / 2, (got - sent) / 2
            )
            if status.server_id and status.server_id != node:
                log.error("node id mismatch", extra={"node": node, "reported": status.server_id})
            else:
                ok = True
                self._watch_probe_port(node, address, status.probe_port)
                report = NodeReport.of(started, status.channels)
                self.memory.observe(node, report)
                self._replica_metrics(node, report)
        except StreamingError as err:
            gone = refused(str(err))
        if self.config.nodes.get(node) != address:
            return  # the node left (or moved) while we asked it
        now = self.clock()
        self._feed_pings(now)  # pings that arrived meanwhile count first
        change = self.tracker.observe(node, ok, now, gone)
        if change is not None:
            self._on_transition(node, change.after)
        if self.pinger is not None and self.tracker.wants_ping(node):
            self.pinger.poke()
        self._note_down(now)
        if ok:
            self._check(node)

    def _check(self, node: int) -> None:
        """Ask the planner what `node`'s new report needs (`needs_action`), unless nothing
        that answer depends on changed since it last found nothing: the same records,
        the same pchannels served under the same terms, roles and health, and that
        report begun after the executor's latest assignment; and at least every
        QUIET_RECHECK_S all the same (a bound on what an input overlooked here could
        cost). At 4,096 x 3 on 4 nodes the walk over a node's 3,072 pchannels at every
        probe was two thirds of an idle coord's CPU (docs/benchmarks.md, "Scale")."""
        report = self.memory.reports[node]
        served = tuple(
            (s.pchannel.name, s.pchannel.term, s.role, s.data_loss, s.unhealthy)
            for s in report.channels.values()
        )
        quiet = self._quiet.pop(node, None)
        if quiet is not None:
            version, before, started = quiet
            if (
                version == self.records.version
                and before == served
                and started > self.memory.touched_at
                and report.started - started < QUIET_RECHECK_S
            ):
                self._quiet[node] = quiet
                return
        flagged = pl.needs_action(node, self._snapshot())
        if flagged:
            self._dirty |= flagged
            self.wake()
        else:
            self._quiet[node] = (self.records.version, served, report.started)

    def _feed_pings(self, now: float) -> None:
        """Hand the pinger's outcomes to the tracker, before anything else is judged."""
        heard = self.pinger.drain() if self.pinger is not None else ()
        outcomes = ((h.node, h.ok, h.at, h.refused) for h in heard)
        for change in self.tracker.heard_all(outcomes, now):
            self._on_transition(change.node, change.after)
        self._note_down(now)

    def _note_down(self, now: float) -> None:
        """A node newly known dead wakes the planner (its replicated leaderships fail over
        at once); one that answers again is forgotten."""
        down = self.tracker.down()
        for node in set(self._down_at) - down:
            del self._down_at[node]
            self._mark(node)
        for node in sorted(down - set(self._down_at)):
            self._down_at[node] = now
            self._mark(node)
            log.warning("node down: its ports refuse connections", extra={"node": node})
            self.wake()

    def _watch_probe_port(self, node: int, address: str, port: int) -> None:
        """Ping the probe port the node names (on its gRPC host); none: stop pinging."""
        if self.pinger is not None:
            host = address.rpartition(":")[0]
            self.pinger.watch(node, f"{host}:{port}" if port else None)

    def _log_held(self, now: float) -> None:
        """Say once when the loss policy holds back declaring nodes lost, and when not."""
        held = self.tracker.held(now)
        if held != self._held:
            if held:
                log.warning(
                    "nodes not answering but not declared lost: too many at once, or too "
                    "soon after the last loss",
                    extra={"nodes": held, "max_share": self.config.max_loss_share},
                )
            self._held = held
        self.metrics.nodes_held.set(len(held))

    def _observe_clock(self, node: int, offset: float, uncertainty: float) -> None:
        """Keep how far a node's clock is from ours (`offset`, known within `uncertainty`);
        beyond the bound it leads nothing (`planner.clock_skewed`)."""
        self.metrics.clock_offset.labels(str(node)).set(offset)
        bound = self.config.max_clock_offset
        skewed = pl.clock_skewed(offset, uncertainty, bound, node in self.skewed)
        if skewed and node not in self.skewed:
            log.warning(
                "node clock too far off: it leads nothing until it is back within the bound",
                extra={
                    "node": node,
                    "offset_s": round(offset, 3),
                    "max_s": self.config.max_clock_offset,
                },
            )
            self._full_due = True
            self.wake()
        elif not skewed and node in self.skewed:
            log.info("node clock back within the bound", extra={"node": node})
            self._full_due = True
            self.wake()
        if skewed:
            self.skewed[node] = offset
        else:
            self.skewed.pop(node, None)

    def _replica_metrics(self, node: int, report: NodeReport) -> None:
        """A leader's report updates its followers' progress metrics."""
        for name, status in report.channels.items():
            record = self.records.live(name)
            if record is None or not rs.is_replicated(record) or status.role != pl.LEADER:
                continue
            meta = record.meta
            if meta.node.server_id == node and status.pchannel.term == meta.channel.term:
                self.metrics.set_replicas(name, status)

    def _mark(self, node: int) -> None:
        """Something about `node` changed: the next round plans every pchannel it holds."""
        self._dirty.update(self.records.held().get(node, ()))

    def _on_transition(self, node: int, after: Liveness) -> None:
        log.info("node liveness changed", extra={"node": node, "liveness": after.value})
        self._mark(node)
        if after == Liveness.LOST:
            self.memory.lost_at[node] = self.clock()
            self.memory.forget(node)
        if after == Liveness.LIVE:
            self._rebalance_due = True
            address = self.config.nodes.get(node)
            if address is not None:
                self.links.reconnect(address)
        self.wake()

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
                self._full_due = True  # what it took to plan may not have been planned
                await asyncio.sleep(0.2)
            except Exception:
                log.exception("reconcile round failed")
                self._full_due = True
                await asyncio.sleep(0.2)

    def _snapshot(self) -> pl.Snapshot:
        return pl.Snapshot(
            records=self.records.all(),
            nodes=self.config.nodes,
            drained=frozenset(self.avoided()),
            memory=self.memory,
            rebalance_due=self._rebalance_due,
            max_moves=self.config.max_moves_per_round,
            tolerance=self.config.tolerance,
            grace=self.config.grace,
            labels=self.labels,
            domains=self.domains,
            held=self.records.held(),
        )

    async def reconcile_once(self) -> None:
        """One round: observe, plan, run (recover, place, fail over, fence, rebalance)."""
        if not self.active:
            self._full_due = True  # a standby's first round as leader looks at everything
            return
        now = self.clock()
        if now >= self._next_rebalance:
            self._rebalance_due = True
            self._next_rebalance = now + self.config.rebalance_interval
        seen = self._observe_liveness(frozenset(await self._rechecks()))
        dirty = self._take_dirty(seen)
        self.metrics.planned.inc(len(self.records.all()) if dirty is None else len(dirty))
        plan = pl.plan(self._snapshot(), seen, now, dirty)
        self._unsettled = set(plan.unsettled)
        if plan.rebalanced:
            self._rebalance_due = self._single_on_avoided()
        for job in plan.fence:  # fenced once per observation; the next probe tells
            report = self.memory.reports.get(job.node.server_id)
            if report is not None:
                self.memory.reports[job.node.server_id] = report.without([job.name])
        if plan.rebalance:
            metas = self.records.metas()
            moves = [(j.name, metas[j.name].node.server_id, j.target) for j in plan.rebalance]
            log.info(
                "rebalancing", extra={"moves": [(n, s, t and t.server_id) for n, s, t in moves]}
            )
        await self.executor.run(plan, self._round(seen, plan.leaders, len(plan)))

    def _take_dirty(self, seen: pl.Observations) -> set[str] | None:
        """What this round plans (None: every pchannel); the sets start over."""
        changed = self.records.take_changed()
        constrained = bool(self.labels or self.domains) and seen.live != self._last_live
        full = self._full_due or self._rebalance_due or constrained
        dirty = self._dirty | self._unsettled | changed | seen.rechecked
        self._dirty, self._full_due, self._last_live = set(), False, seen.live
        return None if full else dirty

    def _observe_liveness(self, rechecked: frozenset[str] = frozenset()) -> pl.Observations:
        nodes = set(self.config.nodes)
        return pl.Observations(
            alive=frozenset(self.tracker.alive() & nodes),
            live=frozenset(self.tracker.live()),
            lost=frozenset(n for n in nodes if self.tracker.state(n) == Liveness.LOST),
            rechecked=rechecked,
            down=frozenset(self._down_at),
        )

    def _round(
        self, seen: pl.Observations, leaders: Mapping[int, int], jobs: int = 1
    ) -> sagas.Round:
        """What the sagas of one round share (a copy of the node set: it may change).

        Its `jobs` run together, so each node answers about jobs / nodes calls at once
        (times the replicas): the deadlines grow with that share (`Timeouts.scaled`)."""
        return sagas.Round(
            nodes=dict(self.config.nodes),
            alive=seen.alive,
            live=seen.live,
            lost=seen.lost,
            drained=frozenset(self.avoided()),
            timeouts=sagas.Timeouts(
                self.config.assign_timeout, self.config.remove_timeout, self.config.fence_timeout
            ).scaled(jobs / max(1, len(seen.live))),
            leaders=dict(leaders),
            seen_terms=MappingProxyType(self.memory.seen_term),
        )

    async def _rechecks(self) -> set[str]:
        """Pchannels reported by clients whose owner answers but does not serve them now.

        An owner that does not answer is left to liveness: it either comes back (then its
        pchannels move, or are re-assigned, with catch-up from it) or is declared LOST after
        the grace period (failover). Moving at once would have to leave its records behind.
        """
        names, self.memory.recheck = self.memory.recheck, set()
        out: set[str] = set()
        for name in sorted(names):
            record = self.records.live(name)
            if record is None or rs.is_replicated(record) or record.meta.state != sm.ASSIGNED:
                continue
            meta = record.meta
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
