"""Node liveness from probe results: pure logic fed with outcomes and a clock.

A node is LIVE after a successful probe, SUSPECT while probes fail but the last success
(or the moment tracking started) is within the grace period, and LOST after that. A node
never seen since tracking started is UNKNOWN until it answers or the grace runs out.
`observe` returns the transitions that matter to the coord: a node joining (-> LIVE from
anything else) and a node lost (-> LOST).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The one default of each (coord, operator, their CLIs and the chart's `failover` values).
# The grace outlasts an ordinary pod restart (container restart, or a StatefulSet pod
# deleted and recreated on its PVC: typically 5-20 s), so a restarting node is not
# declared lost. Safe failover does not rest on it (a single copy waits for its node
# whatever the grace), but it is how long a pchannel that allows data loss waits before
# moving without its records, and how long a coord waits before replacing an unanswering
# replicated leader.
DEFAULT_PROBE_INTERVAL = 0.5
DEFAULT_GRACE = 30.0


class Liveness(StrEnum):
    UNKNOWN = "unknown"
    LIVE = "live"
    SUSPECT = "suspect"
    LOST = "lost"


@dataclass(frozen=True)
class Transition:
    node: int
    before: Liveness
    after: Liveness

    @property
    def joined(self) -> bool:
        return self.after == Liveness.LIVE

    @property
    def lost(self) -> bool:
        return self.after == Liveness.LOST


@dataclass
class _Track:
    since: float  # start of tracking, or the last success
    state: Liveness = Liveness.UNKNOWN
    last_probe: float | None = None


class LivenessTracker:
    """Decides when to probe each node and what its probes mean.

    `interval`: seconds between probes of one node. `grace`: how long a node may fail to
    answer before it is LOST (should exceed one interval, or a single slow probe loses it).
    """

    def __init__(self, interval: float, grace: float) -> None:
        if interval <= 0 or grace <= 0:
            raise ValueError("interval and grace must be positive")
        self.interval = interval
        self.grace = grace
        self._nodes: dict[int, _Track] = {}

    def track(self, node: int, now: float) -> None:
        """Start tracking `node` (idempotent)."""
        self._nodes.setdefault(node, _Track(since=now))

    def forget(self, node: int) -> None:
        self._nodes.pop(node, None)

    def due(self, now: float) -> list[int]:
        """Nodes whose next probe is due."""
        return sorted(
            n
            for n, t in self._nodes.items()
            if t.last_probe is None or now - t.last_probe >= self.interval
        )

    def observe(self, node: int, ok: bool, now: float) -> Transition | None:
        """Feed one probe outcome; returns the state change it caused, if any."""
        track = self._nodes.setdefault(node, _Track(since=now))
        track.last_probe = now
        if ok:
            track.since = now
        return self._settle(node, track, ok, now)

    def tick(self, now: float) -> list[Transition]:
        """Age every node without a probe result (a hung probe must still lose a node)."""
        out = []
        for node, track in sorted(self._nodes.items()):
            change = self._settle(node, track, track.state == Liveness.LIVE, now)
            if change:
                out.append(change)
        return out

    def _settle(self, node: int, track: _Track, ok: bool, now: float) -> Transition | None:
        before = track.state
        if ok and now - track.since <= self.grace:
            after = Liveness.LIVE
        elif now - track.since > self.grace:
            after = Liveness.LOST
        else:
            after = Liveness.UNKNOWN if before == Liveness.UNKNOWN else Liveness.SUSPECT
        track.state = after
        return Transition(node, before, after) if after != before else None

    def state(self, node: int) -> Liveness:
        track = self._nodes.get(node)
        return track.state if track else Liveness.UNKNOWN

    def live(self) -> set[int]:
        """Nodes that answered recently: the only ones that get new channels."""
        return {n for n, t in self._nodes.items() if t.state == Liveness.LIVE}

    def alive(self) -> set[int]:
        """Nodes not (yet) declared lost: their channels stay where they are."""
        return {n for n, t in self._nodes.items() if t.state != Liveness.LOST}
