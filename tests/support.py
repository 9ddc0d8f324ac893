"""Helpers shared by the test suites that run real processes."""

from __future__ import annotations

import asyncio
import time


async def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Await `predicate()` (sync or async) until truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
