"""Stopping background tasks, the one way every part does it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import suppress

RECANCEL_S = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel every task, then wait for each to end, so nothing it owns outlives the
    caller's stop. A task's own exception propagates: a stop must not hide a crash.

    A task still running `RECANCEL_S` after its cancel is cancelled again: Python
    3.11's `asyncio.wait_for` returns its inner result and drops the cancel when both
    happen at once, and a polling loop above it then never ends (a MsgStream close hung
    a CI run for 300 s that way)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        while not task.done():
            await asyncio.wait({task}, timeout=RECANCEL_S)
            task.cancel()
        with suppress(asyncio.CancelledError):
            await task
