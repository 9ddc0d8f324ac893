"""Leader election on a `coordination.k8s.io/v1` Lease: the decisions, pure (no I/O).

The rules are client-go's (what controller-runtime managers use), with its defaults: a
candidate takes the Lease when it is absent, released (no holder), or not renewed for
`lease_duration` (15 s); the leader renews it every `retry_period` (2 s) and stops acting
as soon as `renew_deadline` (10 s) passed since the start of its last successful renewal.

Times are this process's monotonic clock, never the holder's timestamps: a candidate
notes when it first saw each renewal (`observe`), so clocks of different machines never
meet. It takes that moment to be `retry_period` before the read that showed it (or the
previous read, if that was later), since it polls every `retry_period`: the renewal
committed no earlier than that. So a candidate takes over at most `lease_duration` after
the dead leader's last renewal (not up to `retry_period` later, as client-go does, which
would miss the 15 s target), while the leader, which renewed at R, stopped acting by
R + `renew_deadline`: the candidate acts no earlier than R + `lease_duration` -
`retry_period` (13 s) minus the read's latency, 3 s after.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElectionConfig:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        retry, deadline, duration = self.retry_period, self.renew_deadline, self.lease_duration
        if not 0 < retry < deadline < duration - retry:
            raise ValueError(
                "need 0 < retry period < renew deadline < lease duration - retry period "
                f"(got {self.retry_period}, {self.renew_deadline}, {self.lease_duration})"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec as read (`renewed` is the holder's renewTime, compared only for
    equality; `version` is the object's resourceVersion, the write precondition)."""

    holder: str
    duration: float
    transitions: int
    renewed: str
    version: str


@dataclass(frozen=True)
class Write:
    """Create (no `version`) or replace the Lease with this holder; `acquire` sets a new
    acquireTime (the holder changes)."""

    holder: str
    duration: float
    transitions: int
    acquire: bool
    version: str | None


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Lost:
    reason: str


Decision = Write | Wait | Lost


class Election:
    """One candidate's view: what it last saw of the Lease and when; whether it leads."""

    def __init__(self, identity: str, config: ElectionConfig) -> None:
        self.identity = identity
        self.config = config
        self.seen: LeaseRecord | None = None
        self.seen_at = 0.0  # the earliest the seen renewal can have committed
        self.last_read = float("-inf")
        self.renewed_at: float | None = None  # set while leading: start of the last renewal

    @property
    def leading(self) -> bool:
        return self.renewed_at is not None

    def observe(self, record: LeaseRecord | None, read_started: float) -> None:
        """A read of the Lease that started at `read_started` returned `record`."""
        changed = (
            record is None
            or self.seen is None
            or ((record.holder, record.renewed) != (self.seen.holder, self.seen.renewed))
        )
        if changed:
            self.seen_at = max(self.last_read, read_started - self.config.retry_period)
        self.seen = record
        self.last_read = read_started

    def wrote(self, write: Write, version: str, renewed: str, started: float) -> None:
        """Our write (begun at `started`) was accepted: we hold the Lease."""
        self.seen = LeaseRecord(write.holder, write.duration, write.transitions, renewed, version)
        self.seen_at = started
        self.last_read = started
        self.renewed_at = started

    def deadline_passed(self, now: float) -> bool:
        return self.renewed_at is not None and now - self.renewed_at >= self.config.renew_deadline

    def decide(self, now: float) -> Decision:
        cfg, seen = self.config, self.seen
        if self.leading:
            if self.deadline_passed(now):
                return Lost(f"not renewed for {cfg.renew_deadline:g} s")
            if seen is not None and seen.holder != self.identity:
                return Lost(f"the Lease is held by {seen.holder}")
            assert self.renewed_at is not None
            if now < self.renewed_at + cfg.retry_period:
                return Wait(self.renewed_at + cfg.retry_period - now)
        if seen is None:
            return Write(self.identity, cfg.lease_duration, 0, True, None)
        mine = seen.holder == self.identity
        free = not seen.holder or now >= self.seen_at + seen.duration
        if mine or free:
            transitions = seen.transitions + (0 if mine else 1)
            return Write(self.identity, cfg.lease_duration, transitions, not mine, seen.version)
        return Wait(min(cfg.retry_period, self.seen_at + seen.duration - now))
