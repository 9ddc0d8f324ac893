"""Hybrid time ticks: physical milliseconds shifted left by 18 bits plus a logical counter.

This is Milvus's TSO layout, so ticks convert to wall time (`tick >> 18` ms) and stay
unique. A pchannel's ticks only grow, also across terms and restarts: the node feeds the
last persisted tick back through `observe`, and `allocate` never returns a tick at or
below it, even if the wall clock stepped backwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable

LOGICAL_BITS = 18
MAX_BARRIER_AHEAD_MS = 60_000  # clock skew tolerated between the nodes' wall clocks


class BarrierTooFar(ValueError):
    """A barrier tick too far in the future to honour without wrecking the clock."""


def compose(physical_ms: int, logical: int = 0) -> int:
    return (physical_ms << LOGICAL_BITS) | logical


def physical_ms(tick: int) -> int:
    return tick >> LOGICAL_BITS


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class HybridClock:
    """Allocates strictly increasing ticks; one clock per pchannel."""

    def __init__(self, now_ms: Callable[[], int] = _wall_ms) -> None:
        self._now_ms = now_ms
        self._last = 0

    @property
    def last(self) -> int:
        return self._last

    def observe(self, tick: int) -> None:
        """Never hand out a tick at or below `tick` from now on."""
        if tick > self._last:
            self._last = tick

    def push_past(self, barrier: int, max_ahead_ms: int = MAX_BARRIER_AHEAD_MS) -> None:
        """Make the next tick exceed `barrier` (a tick from another clock, e.g. a
        RawAppend barrier). A barrier far ahead of the wall clock would drag this clock
        into the future for good, so one over `max_ahead_ms` ahead is refused."""
        ahead = physical_ms(barrier) - self._now_ms()
        if ahead > max_ahead_ms:
            raise BarrierTooFar(
                f"barrier time tick {barrier} is {ahead} ms ahead of this node's clock "
                f"(at most {max_ahead_ms} ms allowed)"
            )
        self.observe(barrier)

    def allocate(self, count: int = 1) -> int:
        """Reserve `count` consecutive ticks and return the first."""
        first = max(compose(self._now_ms()), self._last + 1)
        self._last = first + count - 1
        return first
