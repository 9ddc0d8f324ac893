"""Node liveness from probe results: pure logic fed with outcomes and a clock.

Two signals tell the coord whether a node lives: its CollectStatus probes (`observe`,
answered on the node's event loop, behind its data work) and, when the node has a probe
port, pings answered by threads of their own (`heard`, node/probe_port.py). A node is
LIVE while the latest outcome of either signal is a success within the grace period,
SUSPECT while both fail but the last success (or the moment tracking started) is within
the grace period, and LOST after that: a loaded node whose status probes time out but
whose pings answer is slow, not dead, and is never declared lost (issue 24).

Declaring a loss starts fences and moves of everything the node held, work that loads
the survivors; so losses are rate-limited and damped as Kubernetes' node lifecycle
controller does (`LossPolicy`): at most one declaration per `gap` seconds, and none at
all while more than `max_share` of the nodes look dead at once, which says more about
the coord (cut off, or starved itself) than about the nodes. Such a node stays SUSPECT
(`held()` names it) until the rule allows or it answers.

A node whose latest status probe and latest ping were both refused (nothing listens on
either port: `refused`) is DOWN as well as SUSPECT: its process is gone, not slow -- a
loaded node's kernel still accepts connections, and a coord cut off from it gets
timeouts, never refusals. The grace still decides LOST; what DOWN allows is the planner's
(a replicated pchannel's leader there fails over at once when a majority of its replicas
is up: that failover is clean). A first refusal of one signal brings the other's next
probe forward once, so the two agree within a round trip, not an interval.

A node never seen since tracking started is UNKNOWN until it answers or the grace runs
out. `observe` returns the transitions that matter to the coord: a node joining (-> LIVE
from anything else) and a node lost (-> LOST).
"""

from __future__ import annotations

from collections.abc import Iterable
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


def refused(error: str) -> bool:
    """Whether a failed probe's error says nothing listens there (the connection was
    refused), as opposed to a timeout or a failure of a live process."""
    return "Connection refused" in error


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


@dataclass(frozen=True)
class LossPolicy:
    """How fast nodes may be declared lost: Kubernetes' eviction rate and its "unhealthy
    zone" threshold (0.55), for one zone. At least one node may always be lost."""

    max_share: float = 0.55
    gap: float = 0.0  # seconds between two declarations

    def allows(self, dead: int, nodes: int, last_loss: float | None, now: float) -> bool:
        """Whether one more node may be declared lost now, `dead` nodes (this one among
        them) being past their grace of `nodes` tracked."""
        if dead > max(1, int(self.max_share * nodes)):
            return False
        return last_loss is None or now - last_loss >= self.gap


@dataclass
class _Track:
    since: float  # start of tracking, or the last success of either signal
    state: Liveness = Liveness.UNKNOWN
    last_probe: float | None = None
    status_ok: bool = False  # the latest CollectStatus outcome
    ping_ok: bool = False  # the latest ping outcome (False also: no ping signal yet)
    status_refused: bool = False  # the latest CollectStatus was refused
    ping_refused: bool = False  # the latest ping was refused

    @property
    def ok(self) -> bool:
        return self.status_ok or self.ping_ok


class LivenessTracker:
    """Decides when to probe each node and what its probes mean.

    `interval`: seconds between probes of one node. `grace`: how long a node may fail to
    answer before it is LOST (should exceed one interval, or a single slow probe loses it).
    """

    def __init__(self, interval: float, grace: float, policy: LossPolicy | None = None) -> None:
        if interval <= 0 or grace <= 0:
            raise ValueError("interval and grace must be positive")
        self.interval = interval
        self.grace = grace
        self.policy = policy or LossPolicy()
        self._nodes: dict[int, _Track] = {}
        self._last_loss: float | None = None
        self._last_tick: float | None = None

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

    def _credit_stall(self, now: float) -> None:
        """Time the coord itself did not run says nothing about the nodes. The coord ticks
        many times per probe interval; a gap of more than two intervals between ticks is
        its loop or process starved, and is credited to every node, so a coord that wakes
        late judges no node by its own absence."""
        last, self._last_tick = self._last_tick, max(now, self._last_tick or now)
        if last is None or now - last <= 2 * self.interval:
            return
        stalled = now - last - self.interval
        for track in self._nodes.values():
            track.since = min(now, track.since + stalled)

    def observe(self, node: int, ok: bool, now: float, refused: bool = False) -> Transition | None:
        """Feed one CollectStatus outcome (`refused`: the connection was); returns the
        state change it caused, if any."""
        track = self._nodes.setdefault(node, _Track(since=now))
        track.last_probe = now
        track.status_ok = ok
        track.status_refused = refused and not ok
        if ok:
            track.since = now
        return self._settle(node, track, now)

    def heard(
        self, node: int, ok: bool, at: float, now: float, refused: bool = False
    ) -> Transition | None:
        """Feed one ping outcome (the second signal), got at `at` (<= `now`: pings are
        answered and timed off the coord's loop, and fed to it later)."""
        changes = self.heard_all([(node, ok, at, refused)], now)
        return changes[0] if changes else None

    def heard_all(
        self, outcomes: Iterable[tuple[int, bool, float, bool]], now: float
    ) -> list[Transition]:
        """Feed the ping outcomes (node, ok, at, refused) that arrived since the last
        call, oldest first, then judge each node once: a coord that drains them late must
        neither judge before crediting its own stall nor take a failed ping followed by a
        good one for a node that went SUSPECT and came back (healthy nodes flapped so,
        issue 24)."""
        self._credit_stall(now)
        touched: set[int] = set()
        for node, ok, at, refused in outcomes:
            track = self._nodes.get(node)
            if track is None:
                continue  # not tracked (left the node set)
            if refused and not ok and not track.ping_refused and not track.status_refused:
                track.last_probe = None  # the status probe tells at once whether it agrees
            track.ping_ok = ok
            track.ping_refused = refused and not ok
            if ok:
                track.since = max(track.since, at)
            touched.add(node)
        out = []
        for node in sorted(touched):
            change = self._settle(node, self._nodes[node], now)
            if change:
                out.append(change)
        return out

    def tick(self, now: float) -> list[Transition]:
        """Age every node without a probe result (a hung probe must still lose a node)."""
        self._credit_stall(now)
        out = []
        for node, track in sorted(self._nodes.items()):
            change = self._settle(node, track, now)
            if change:
                out.append(change)
        return out

    def _settle(self, node: int, track: _Track, now: float) -> Transition | None:
        before = track.state
        if track.ok and now - track.since <= self.grace:
            after = Liveness.LIVE
        elif now - track.since > self.grace and (before == Liveness.LOST or self._may_lose(now)):
            after = Liveness.LOST
            if before != Liveness.LOST:
                self._last_loss = now
        else:
            after = Liveness.UNKNOWN if before == Liveness.UNKNOWN else Liveness.SUSPECT
        track.state = after
        return Transition(node, before, after) if after != before else None

    def _may_lose(self, now: float) -> bool:
        dead = sum(1 for t in self._nodes.values() if now - t.since > self.grace)
        return self.policy.allows(dead, len(self._nodes), self._last_loss, now)

    def held(self, now: float) -> list[int]:
        """Nodes past their grace that the loss policy does not let us declare lost yet."""
        return sorted(
            n
            for n, t in self._nodes.items()
            if t.state != Liveness.LOST and now - t.since > self.grace
        )

    def down(self) -> set[int]:
        """Nodes known dead: the latest status probe and the latest ping both refused
        (a node without a probe port is never known dead, only lost after the grace)."""
        return {n for n, t in self._nodes.items() if t.status_refused and t.ping_refused}

    def wants_ping(self, node: int) -> bool:
        """Whether a ping now would tell: the status probe was refused, the ping not yet."""
        track = self._nodes.get(node)
        return track is not None and track.status_refused and not track.ping_refused

    def state(self, node: int) -> Liveness:
        track = self._nodes.get(node)
        return track.state if track else Liveness.UNKNOWN

    def live(self) -> set[int]:
        """Nodes that answered recently: the only ones that get new channels."""
        return {n for n, t in self._nodes.items() if t.state == Liveness.LIVE}

    def alive(self) -> set[int]:
        """Nodes not (yet) declared lost: their channels stay where they are."""
        return {n for n, t in self._nodes.items() if t.state != Liveness.LOST}
