"""Whether this node can serve well: pure bookkeeping for the gray failures a probe misses.

A node whose WAL writes fail (a full or read-only disk, an I/O error) still answers every
probe, and a leader cut off from its followers still answers the coord: both look alive
while no producer is acknowledged. The node says so itself (PChannelStatus.unhealthy) so
the coord moves leadership away, and logs a failing disk once, then a summary now and
then, never once per request (a full disk once wrote 21,578 lines in 20 s).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SUMMARY_EVERY_S = 10.0  # while writes keep failing, one log line per this many seconds


@dataclass
class WriteHealth:
    """Failures of the store's writes since the last success."""

    failing_since: float | None = None
    failures: int = 0
    last_error: str = ""
    _reported_at: float = 0.0
    _reported_failures: int = 0

    def failed(self, now: float, error: str) -> str | None:
        """Record a failed write; the log line it deserves ("first" or "summary"), if any."""
        self.failures += 1
        self.last_error = error
        if self.failing_since is None:
            self.failing_since = now
            self._reported_at, self._reported_failures = now, self.failures
            return "first"
        if now - self._reported_at >= SUMMARY_EVERY_S:
            self._reported_at, self._reported_failures = now, self.failures
            return "summary"
        return None

    def succeeded(self) -> tuple[float, int] | None:
        """Record a successful write; (since, failures) when it ends a failing stretch."""
        if self.failing_since is None:
            return None
        ended = (self.failing_since, self.failures)
        self.failing_since, self.failures, self.last_error = None, 0, ""
        return ended

    def reason(self, now: float) -> str:
        if self.failing_since is None:
            return ""
        return (
            f"WAL writes failing for {now - self.failing_since:.1f}s "
            f"({self.failures} failed): {self.last_error}"
        )


def quorum_contact(heard: Iterable[float], replicas: int, now: float, lease: float) -> bool:
    """Whether a leader heard, within `lease`, from enough followers to make a majority
    of `replicas` with itself (`heard`: when each follower was last heard from)."""
    recent = sum(1 for at in heard if now - at <= lease)
    return recent + 1 >= replicas // 2 + 1


def heard_at(stream: float, node: float | None, open_stream: bool) -> float:
    """When a leader last heard a follower on one pchannel: an ack on that pchannel's
    stream (`stream`), or any word from the follower's node (`node`, a heartbeat or an
    ack on another pchannel) while that pchannel's stream from it is open. An idle
    pchannel's follower then needs no record of its own to keep the quorum lease."""
    if open_stream and node is not None:
        return max(stream, node)
    return stream
