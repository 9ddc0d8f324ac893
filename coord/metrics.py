"""Prometheus metrics of the coord, in a registry of its own (one per Coordinator)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamwal.proto import streaming_pb2 as pb


class CoordMetrics:
    """`streamwal_pchannel_info` plus counters of changes and failovers."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
        self.nodes_live = Gauge(
            "streamwal_coord_nodes_live",
            "Streaming nodes answering probes.",
            registry=self.registry,
        )
        self._labels: dict[str, tuple[str, str, str, str]] = {}

    def set_channel(self, meta: pb.PChannelMeta | None, name: str) -> None:
        """Point the info series of `name` at `meta` (None: the channel is gone)."""
        old = self._labels.pop(name, None)
        if old is not None:
            self.pchannel_info.remove(*old)
        if meta is None:
            return
        state = pb.PChannelMetaState.Name(meta.state).removeprefix("PCHANNEL_META_STATE_").lower()
        node = str(meta.node.server_id) if meta.HasField("node") else ""
        labels = (name, str(meta.channel.term), node, state)
        self.pchannel_info.labels(*labels).set(1)
        self._labels[name] = labels
