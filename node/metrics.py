"""Prometheus metrics of a streaming node, all prefixed `streamwal_`.

What the append path counts is kept in plain ints and read when Prometheus scrapes:
appended messages and bytes per pchannel, and the append and write latency histograms
(`ScrapedHistogram`). prometheus_client takes a lock for every counter, histogram sum and
bucket increment, eight per one-message batch, a tenth of the node's Python time on
that path. A pchannel's state (term, log size and end, commit offset) is likewise read
from the channels at scrape time. Each node owns a registry so several nodes can live in
one process (tests, the embedded cluster).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from streamwal.node import records

_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # pchannel -> [client messages, record bytes, time ticks] appended since the start
        self._appended: dict[str, list[int]] = {}
        # pchannel -> [messages] delivered to consumers and groups (no ticks)
        self._delivered: dict[str, list[int]] = {}
        if registry is None:
            # The process and the interpreter (process_*, python_*), as the default
            # registry has them; a node's registry is its own, so they are added here.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.append_latency = ScrapedHistogram(
            "streamwal_append_latency_seconds",
            "From accepting an append to its durable commit",
            _LATENCY_BUCKETS,
        )
        self.fsync_latency = ScrapedHistogram(
            "streamwal_fsync_latency_seconds",
            "Duration of one group-commit write (with fsync under sync durability)",
            _LATENCY_BUCKETS,
        )
        r.register(_AppendCollector(self))
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
        self.group_lag = Gauge(
            "streamwal_group_lag_messages",
            "Messages (no time ticks) from a consumer group's committed offset to the end",
            ["group", "pchannel"],
            registry=r,
        )
        self.group_redelivered = Counter(
            "streamwal_group_redelivered_messages_total",
            "Messages handed again to a group because the consumer that had them went "
            "away without committing",
            ["group", "pchannel"],
            registry=r,
        )
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
        self.corruptions = Counter(
            "streamwal_corruption_detected",
            "Times a pchannel's log was found to lack acknowledged records, by how it was"
            " found (ledger: shorter than acknowledged at start-up; read, verify: a record"
            " failed its checksum or is missing)",
            ["found_by"],
            registry=r,
        )
        self.txns = Counter(
            "streamwal_txns",
            "Transactions ended, by outcome (committed, rolled_back, expired, lost, refused)",
            ["outcome"],
            registry=r,
        )

        self.limit_exceeded = Counter(
            "streamwal_limit_exceeded",
            "Refusals (RESOURCE_EXHAUSTED) and slowed producers by one of the node's limits, "
            "named as in docs/limits.md",
            ["limit"],
            registry=r,
        )

    def watch_limits(
        self, configured: dict[str, float], usage: Callable[[], dict[str, float]]
    ) -> None:
        """Export every limit's configured value and, where it counts something held
        (connections, streams, buffered bytes, txns), how much is held at scrape time."""
        self.registry.register(_LimitCollector(configured, usage))

    def count_append(self, pchannel: str, count: int, size: int, flags: int) -> None:
        """A durable record of `count` messages, `size` bytes with `flags`
        (records.FLAG_*): the node's own time ticks and internal records (cursor
        snapshots) are counted apart from the messages clients sent, so an idle pchannel
        does not look like it takes traffic."""
        totals = self._appended.get(pchannel)
        if totals is None:
            totals = self._appended[pchannel] = [0, 0, 0]
        if flags & records.FLAG_TIME_TICK:
            totals[2] += count
        elif not flags & records.INTERNAL_FLAGS:
            totals[0] += count
        totals[1] += size

    def delivered(self, pchannel: str) -> list[int]:
        """[messages] delivered to consumers of `pchannel` (no time ticks): add in place."""
        totals = self._delivered.get(pchannel)
        if totals is None:
            totals = self._delivered[pchannel] = [0]
        return totals

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
    data_loss: int
    retention_age_seconds: float
    retention_bytes: int


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
    (
        "streamwal_pchannel_data_loss",
        "1 while this node's log of the pchannel lacks records it acknowledged (corruption):"
        " not served until rebuilt from a replica or the loss is accepted",
    ),
    (
        "streamwal_pchannel_retention_age_seconds",
        "Retention this node applies: records older than this are cut (0: kept forever)",
    ),
    (
        "streamwal_pchannel_retention_bytes",
        "Retention this node applies: the log is cut from its head beyond this (0: no bound)",
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


class ScrapedHistogram:
    """A Prometheus histogram observed with one bisect and two adds, exported at scrape.

    Observed from the event loop only. A scrape from the exporter's thread may read a sum
    one observation apart from the counts, which a histogram's readers tolerate.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = list(buckets)
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def metric(self) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], list(self._counts), strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self._sum
        )


class _AppendCollector(Collector):
    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        messages = CounterMetricFamily(
            "streamwal_appended_messages",
            "Messages appended by clients (time ticks not counted)",
            labels=["pchannel"],
        )
        ticks = CounterMetricFamily(
            "streamwal_appended_time_ticks",
            "TimeTick messages the node appended (idle pchannels get a few per second)",
            labels=["pchannel"],
        )
        size = CounterMetricFamily(
            "streamwal_appended_bytes", "Record bytes appended", labels=["pchannel"]
        )
        delivered = CounterMetricFamily(
            "streamwal_delivered_messages",
            "Messages delivered to consumers and consumer groups (time ticks not counted); "
            "its rate is the pchannel's consume rate",
            labels=["pchannel"],
        )
        for pchannel, (count, nbytes, tick_count) in list(m._appended.items()):
            messages.add_metric([pchannel], count)
            size.add_metric([pchannel], nbytes)
            ticks.add_metric([pchannel], tick_count)
        for pchannel, (count,) in list(m._delivered.items()):
            delivered.add_metric([pchannel], count)
        yield messages
        yield ticks
        yield size
        yield delivered
        yield m.append_latency.metric()
        yield m.fsync_latency.metric()


class _LimitCollector(Collector):
    def __init__(self, configured: dict[str, float], usage: Callable[[], dict[str, float]]):
        self._configured = configured
        self._usage = usage

    def collect(self) -> Iterator[GaugeMetricFamily]:
        limit = GaugeMetricFamily(
            "streamwal_limit", "A limit's configured value (docs/limits.md)", labels=["limit"]
        )
        for name, value in self._configured.items():
            limit.add_metric([name], value)
        used = GaugeMetricFamily(
            "streamwal_limit_usage", "What a limit counts, held now", labels=["limit"]
        )
        for name, value in self._usage().items():
            used.add_metric([name], value)
        yield limit
        yield used
