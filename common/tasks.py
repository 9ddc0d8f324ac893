"""Stopping background tasks, the one way every part does it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import suppress


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel every task, then wait for each to end, so nothing it owns outlives the
    caller's stop. A task's own exception propagates: a stop must not hide a crash."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with suppress(asyncio.CancelledError):
            await task
