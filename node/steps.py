"""A core input's steps (core.advance) on the event loop: from a task, or from callbacks.

`core.advance` runs an input's steps by plain calls while each step's outcome is at hand
and stops at the first `Pending`. `drive` runs an input to its end from a task, awaiting
each Pending. `Drive` runs one from callbacks: a future's outcome (a synced write's)
resumes it from the future's done callback, and only a coroutine -- a step that waits
in its own way: a read, a cut in a worker thread, a drain -- is handed to a task that
goes on with `drive`. A follower applies its leader's entries with `Drive` from the
replication port's `data_received` (replication.FollowerStream): a one-at-a-time send
costs it no task wake-up, no queue and no shield around its write
(docs/decisions-replicated-path.md, "A follower applies as entries arrive").

Waiting for a future never cancels it: a synced write is shared with other callers of
the synced writer, and a fence settles it (Replication.settle) whoever stopped waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from streamwal.errors import Inner, StreamingError
from streamwal.node.core import Effect, Steps, advance

Step = Callable[[Effect], Any]  # a step's I/O: its outcome, or core.Pending
Then = Callable[[Any, BaseException | None], None]  # the input's result, or its error


async def drive(steps: Steps, step: Step, pending: Awaitable[Any] | None = None) -> Any:
    """Run an input's steps to their end (from `pending`, what a `Drive` waited for when
    it handed the input to a task); returns the input's result."""
    while True:
        sent: Any = None
        error: StreamingError | None = None
        if pending is not None:
            try:
                sent = await (asyncio.shield(pending) if asyncio.isfuture(pending) else pending)
            except StreamingError as exc:
                error = exc
        done, got = advance(steps, step, sent, error)
        if done:
            return got
        pending = got


class Drive:
    """One input's steps driven from callbacks (see the module docstring): `then(result,
    None)` or `then(None, error)` is called once it ends, from `start` itself when no
    step had to wait, never after `cancel`."""

    def __init__(self, steps: Steps, step: Step, then: Then) -> None:
        self._steps = steps
        self._step = step
        self._then = then
        self._task: asyncio.Future | None = None
        self._cancelled = False

    def start(self) -> None:
        self._go(None, None)

    def cancel(self) -> None:
        """Nobody waits any more: the steps are left where they are (a write under way
        goes on; the driver settles it), as when a task is cancelled in `drive`."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    def _go(self, sent: Any, error: StreamingError | None) -> None:
        try:
            done, got = advance(self._steps, self._step, sent, error)
        except Exception as exc:  # the input ends with it (Rejected, a disk error...)
            self._then(None, exc)
            return
        if done:
            self._then(got, None)
        elif asyncio.isfuture(got):
            got.add_done_callback(self._resume)
        else:
            self._task = asyncio.ensure_future(drive(self._steps, self._step, got))
            self._task.add_done_callback(self._ended)

    def _resume(self, future: asyncio.Future) -> None:
        if self._cancelled:
            return
        exc = Inner("a step's work was cancelled") if future.cancelled() else future.exception()
        if exc is None:
            self._go(future.result(), None)
        elif isinstance(exc, StreamingError):
            self._go(None, exc)
        else:
            self._then(None, exc)

    def _ended(self, task: asyncio.Future) -> None:
        if self._cancelled or task.cancelled():
            return
        exc = task.exception()
        self._then(None if exc is not None else task.result(), exc)
