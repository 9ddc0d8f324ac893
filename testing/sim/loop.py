"""An asyncio event loop whose clock is virtual: time jumps to the next timer.

The simulator runs the real coordinator, node cores and clients on it, so a sleep, a
timeout or a probe interval costs no wall time and every run with the same seed takes
the same steps: asyncio's ready queue is FIFO and its timer heap orders equal deadlines
by insertion, so given the same inputs (one seeded PRNG) the schedule repeats. Nothing
may block on real I/O here; the selector never waits, it only advances the clock.
"""

from __future__ import annotations

import asyncio
import selectors


class _VirtualSelector(selectors.DefaultSelector):
    """Never waits: a select with a timeout moves the clock to that deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None):
        assert self.loop is not None
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing is scheduled and nothing is ready")
        if timeout > 0:
            self.loop.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual seconds since the loop was made."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now
