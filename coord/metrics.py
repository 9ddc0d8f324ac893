"""Prometheus metrics of the coord, in a registry of its own (one per Coordinator)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from streamwal.proto import streaming_pb2 as pb


class CoordMetrics:
    """`streamwal_pchannel_info` plus counters of changes and failovers."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        if registry is None:  # the process's own (process_*, python_*), as a node has them
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.pchannel_info = Gauge(
            "streamwal_pchannel_info",
            "1 for every pchannel, labelled with its current term, node and state.",
            ["pchannel", "term", "node", "state"],
            registry=self.registry,
        )
        self.assignment_changes = Counter(
            "streamwal_coord_assignment_changes",
            "Changes of the assignment view pushed by AssignmentDiscover.",
            registry=self.registry,
        )
        self.planned = Counter(
            "streamwal_coord_planned_pchannels",
            "Pchannels looked at by reconcile rounds: grows with what changed (records, "
            "liveness, reports), not with the cluster; a full round counts every one.",
            registry=self.registry,
        )
        self.reassignments = Counter(
            "streamwal_coord_reassignments",
            "Completed (re)assignments by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.failovers = Counter(
            "streamwal_coord_failovers",
            "Pchannels moved off a lost node.",
            registry=self.registry,
        )
        self.unclean_failovers = Counter(
            "streamwal_coord_unclean_failovers",
            "Moves off a lost node without catch-up: its unseen records stay on it.",
            registry=self.registry,
        )
        self.failover_duration = Histogram(
            "streamwal_coord_failover_duration_seconds",
            "From detecting a node lost to its pchannel being ASSIGNED elsewhere.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
            registry=self.registry,
        )
        self.clock_offset = Gauge(
            "streamwal_coord_node_clock_offset_seconds",
            "A node's wall clock minus the coord's, as last probed (beyond --max-clock-offset"
            " the node leads nothing).",
            ["node"],
            registry=self.registry,
        )
        self.nodes_live = Gauge(
            "streamwal_coord_nodes_live",
            "Streaming nodes answering probes.",
            registry=self.registry,
        )
        self.waiting = Gauge(
            "streamwal_pchannel_waiting",
            "1 while a pchannel has no leader, labelled with why: no-leader (too few "
            "replicas answered, or the best log is on no candidate), assign-failed, "
            "unavailable (no live node); describe says it in words.",
            ["pchannel", "cause"],
            registry=self.registry,
        )
        self._waiting: dict[str, str] = {}
        self.nodes_held = Gauge(
            "streamwal_coord_nodes_held",
            "Nodes past their grace that the loss policy does not declare lost (too many "
            "at once, or too soon after the last loss).",
            registry=self.registry,
        )
        self.replica_acked = Gauge(
            "streamwal_replica_acked_offset",
            "Replicated pchannels: every offset below is stored and synced on that replica "
            "(as its leader last reported).",
            ["pchannel", "node"],
            registry=self.registry,
        )
        self.replica_lag = Gauge(
            "streamwal_replica_lag",
            "Replicated pchannels: the leader's log end minus the replica's acked offset.",
            ["pchannel", "node"],
            registry=self.registry,
        )
        self.commit_offset = Gauge(
            "streamwal_pchannel_commit_offset",
            "Replicated pchannels: offsets below are stored on a quorum (leader's report).",
            ["pchannel"],
            registry=self.registry,
        )
        self._labels: dict[str, tuple[str, str, str, str]] = {}
        self._replica_nodes: dict[str, set[str]] = {}
        self._replica_from: dict[str, pb.PChannelStatus] = {}  # the status last shown

    def set_channel(self, meta: pb.PChannelMeta | None, name: str) -> None:
        """Point the info series of `name` at `meta` (None: the channel is gone)."""
        old = self._labels.pop(name, None)
        if old is not None:
            self.pchannel_info.remove(*old)
        if meta is None:
            self._drop_replicas(name, set())
            return
        state = pb.PChannelMetaState.Name(meta.state).removeprefix("PCHANNEL_META_STATE_").lower()
        node = str(meta.node.server_id) if meta.HasField("node") else ""
        labels = (name, str(meta.channel.term), node, state)
        self.pchannel_info.labels(*labels).set(1)
        self._labels[name] = labels

    def set_replicas(self, name: str, leader: pb.PChannelStatus) -> None:
        """The replica series of `name` from its leader's status (followers' progress).

        A status equal to the one last shown changes nothing and is skipped: every probe
        of a leader reports all its pchannels, mostly unchanged (issue 24: at 10,000
        pchannels the label lookups were a large share of the coord's CPU per probe)."""
        if self._replica_from.get(name) == leader:
            return
        self._replica_from[name] = leader
        nodes = set()
        for p in leader.replicas:
            node = str(p.node_id)
            nodes.add(node)
            self.replica_acked.labels(name, node).set(p.acked_offset)
            self.replica_lag.labels(name, node).set(p.lag)
        self._drop_replicas(name, nodes)
        self.commit_offset.labels(name).set(leader.commit_offset)
        self._replica_nodes[name] = nodes

    def set_waiting(self, name: str, cause: str | None) -> None:
        """`name` has no leader because of `cause` (None: it has one again)."""
        before = self._waiting.pop(name, None)
        if before is not None:
            self.waiting.remove(name, before)
        if cause is not None:
            self.waiting.labels(name, cause).set(1)
            self._waiting[name] = cause

    def _drop_replicas(self, name: str, keep: set[str]) -> None:
        """Remove the replica series of `name` except `keep` (empty: all, commit included)."""
        if not keep:
            self._replica_from.pop(name, None)
        known = self._replica_nodes.pop(name, None)
        if known is None:
            return
        for node in known - keep:
            self.replica_acked.remove(name, node)
            self.replica_lag.remove(name, node)
        if not keep:
            self.commit_offset.remove(name)
