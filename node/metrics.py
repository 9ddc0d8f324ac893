"""Prometheus metrics of a streaming node, all prefixed `streamwal_`.

Counters are bumped once per record (a batch of messages), never per message, through
children looked up once per pchannel. A pchannel's state (term, log size and end, commit
offset) is read from the channels when Prometheus scrapes, not set on every write: the
label lookups and sets cost the hot path ~25 us per one-message batch. Each node owns a
registry so several nodes can live in one process (tests, the embedded cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.appended_messages = Counter(
            "streamwal_appended_messages", "Messages appended", ["pchannel"], registry=r
        )
        self.appended_bytes = Counter(
            "streamwal_appended_bytes", "Record bytes appended", ["pchannel"], registry=r
        )
        self.append_latency = Histogram(
            "streamwal_append_latency_seconds",
            "From accepting an append to its durable commit",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fsync_latency = Histogram(
            "streamwal_fsync_latency_seconds",
            "Duration of one group-commit write (with fsync under sync durability)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.active_producers = Gauge(
            "streamwal_active_producers", "Open producer streams", ["pchannel"], registry=r
        )
        self.active_consumers = Gauge(
            "streamwal_active_consumers", "Open consumer streams", ["pchannel"], registry=r
        )
        self.consumer_lag = Gauge(
            "streamwal_consumer_lag_messages",
            "Messages between the log end and the slowest consumer",
            ["pchannel"],
            registry=r,
        )
        self._appended: dict[str, tuple] = {}
        self.replica_acked = Gauge(
            "streamwal_replica_acked_offset",
            "On the leader: a follower's acknowledged log end",
            ["pchannel", "replica"],
            registry=r,
        )
        self.replica_lag = Gauge(
            "streamwal_replica_lag",
            "On the leader: its log end minus a follower's acknowledged log end",
            ["pchannel", "replica"],
            registry=r,
        )
        self.role = Gauge(
            "streamwal_replica_role",
            "1 for this node's replication role of the pchannel (leader or follower)",
            ["pchannel", "role"],
            registry=r,
        )
        self.open_txns = Gauge(
            "streamwal_txn_open", "Transactions buffered on the node", registry=r
        )
        self.txns = Counter(
            "streamwal_txns",
            "Transactions ended, by outcome (committed, rolled_back, expired, lost, refused)",
            ["outcome"],
            registry=r,
        )

    def appended(self, pchannel: str) -> tuple:
        """(messages, bytes) counter children of `pchannel`, looked up once."""
        children = self._appended.get(pchannel)
        if children is None:
            children = self._appended[pchannel] = (
                self.appended_messages.labels(pchannel),
                self.appended_bytes.labels(pchannel),
            )
        return children

    def watch_channels(self, channels: Callable[[], Iterable[ChannelState]]) -> None:
        """Export each pchannel's state as it is at scrape time."""
        self.registry.register(_ChannelStateCollector(channels))


class ChannelState(NamedTuple):
    pchannel: str
    term: int
    log_size_bytes: int
    log_end_offset: int
    commit_offset: int
    producer_states: int


_STATE_GAUGES = (
    ("streamwal_pchannel_term", "Term served"),
    ("streamwal_log_size_bytes", "Retained record bytes"),
    ("streamwal_log_end_offset", "Offset the next message will get"),
    (
        "streamwal_commit_offset",
        "Offsets below are committed (stored on a quorum of replicas) and visible",
    ),
    (
        "streamwal_producer_states",
        "Idempotent producers whose state is held in memory (idle ones are dropped)",
    ),
)


class _ChannelStateCollector(Collector):
    def __init__(self, channels: Callable[[], Iterable[ChannelState]]) -> None:
        self._channels = channels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [GaugeMetricFamily(n, h, labels=["pchannel"]) for n, h in _STATE_GAUGES]
        for state in self._channels():
            for family, value in zip(families, state[1:], strict=True):
                family.add_metric([state.pchannel], value)
        yield from families
