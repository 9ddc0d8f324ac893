"""What the coord knows besides its records: the nodes' latest reports and notes on its own
work. Plain data, no I/O; lost on restart by design (a new coord probes again and decides
from the persisted records alone, so nothing here may be needed for safety).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from streamwal.coord import state_machine as sm
from streamwal.proto import streaming_pb2 as pb


@dataclass(frozen=True)
class NodeReport:
    """One node's answer to CollectStatus, and when the probe that got it started."""

    started: float
    channels: Mapping[str, pb.PChannelStatus]

    @staticmethod
    def of(started: float, statuses: Iterable[pb.PChannelStatus]) -> NodeReport:
        return NodeReport(started, MappingProxyType({s.pchannel.name: s for s in statuses}))

    def served(self) -> list[pb.PChannelInfo]:
        return [s.pchannel for s in self.channels.values()]

    def without(self, gone: Iterable[str]) -> NodeReport:
        """The report with `gone` dropped (fenced once per observation)."""
        drop = set(gone)
        return NodeReport(
            self.started,
            MappingProxyType({n: s for n, s in self.channels.items() if n not in drop}),
        )


@dataclass
class Memory:
    """The coord's memory between rounds (written by the coordinator and the executor,
    read by the planner)."""

    # The latest successful CollectStatus of every node still in the node set.
    reports: dict[int, NodeReport] = field(default_factory=dict)
    # The highest end of log any node reported per pchannel (offsets never reused).
    seen_next: dict[str, int] = field(default_factory=dict)
    # The highest term any node reported per pchannel (terms never handed out twice,
    # even if the meta store lost a write: sagas.Round.seen_terms).
    seen_term: dict[str, int] = field(default_factory=dict)
    # When each pchannel was last persisted ASSIGNED: only a later probe can miss it.
    assigned_at: dict[str, float] = field(default_factory=dict)
    # When a member was last assigned as a follower on its own (rejoin, term change).
    rejoined_at: dict[tuple[str, int], float] = field(default_factory=dict)
    # The latest of all assigned_at and rejoined_at: a probe begun before it may not
    # show what was assigned (`needs_action` waits for one begun after).
    touched_at: float = 0.0
    # The node an Assign of a single-replica pchannel last failed on: try another.
    failed_target: dict[str, int] = field(default_factory=dict)
    # The node holding a moving pchannel's records, from the start of a move to its end.
    holders: dict[str, sm.NodeRef] = field(default_factory=dict)
    # A handover the drained leader won (it still had the longest log): retry after this.
    handover_after: dict[str, float] = field(default_factory=dict)
    # When each node was declared lost (failover durations are measured from it).
    lost_at: dict[int, float] = field(default_factory=dict)
    # Pchannels clients reported errors on: the next round asks their owner.
    recheck: set[str] = field(default_factory=set)
    # Single-replica pchannels whose only copy lost acknowledged records: why. They are
    # left alone (a move would copy the damaged log) until the loss is accepted.
    data_loss: dict[str, str] = field(default_factory=dict)
    # Pchannels whose placement leaves them without the nodes they need: why (as said).
    unschedulable: dict[str, str] = field(default_factory=dict)
    # Pchannels without a leader now: why (the last attempt's reason), until one leads.
    waiting: dict[str, str] = field(default_factory=dict)
    # Nodes whose wall clock is farther than the bound from the coord's: offset (s).
    skewed: dict[int, float] = field(default_factory=dict)

    def ineligible(self, node: int, name: str) -> str:
        """Why `node` may not lead `name` by how its clock is or what it last reported
        ("": nothing against it)."""
        offset = self.skewed.get(node)
        if offset is not None:
            return f"its clock is {offset:+.3f}s off the coord's"
        report = self.reports.get(node)
        status = report.channels.get(name) if report else None
        return status.unhealthy if status is not None else ""

    def observe(self, node: int, report: NodeReport) -> None:
        self.reports[node] = report
        for name, status in report.channels.items():
            if status.next_offset > self.seen_next.get(name, 0):
                self.seen_next[name] = status.next_offset
            if status.pchannel.term > self.seen_term.get(name, 0):
                self.seen_term[name] = status.pchannel.term

    def forget(self, node: int) -> None:
        self.reports.pop(node, None)
