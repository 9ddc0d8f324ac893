"""Stopping background tasks (streamwal.tasks): every task ends, crashes are not hidden."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.tasks import RECANCEL_S, cancel_and_wait


async def test_a_task_that_swallowed_its_cancel_is_cancelled_again() -> None:
    """As Python 3.11's wait_for can: the first cancel is lost, the loop polls on."""
    swallowed = 0

    async def poller() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1
                asyncio.current_task().uncancel()

    task = asyncio.create_task(poller())
    await asyncio.sleep(0.02)
    started = time.monotonic()
    await asyncio.wait_for(cancel_and_wait([task]), RECANCEL_S * 4)
    assert task.cancelled() and swallowed == 1
    assert time.monotonic() - started < RECANCEL_S * 3


async def test_a_crash_propagates_and_plain_tasks_stop_at_once() -> None:
    async def crash() -> None:
        raise ValueError("boom")

    async def idle() -> None:
        await asyncio.sleep(3600)

    crashed = asyncio.create_task(crash())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait([crashed])
    tasks = [asyncio.create_task(idle()) for _ in range(3)]
    started = time.monotonic()
    await cancel_and_wait(tasks)
    assert all(t.cancelled() for t in tasks) and time.monotonic() - started < RECANCEL_S
