"""Helpers shared by the test suites that run real processes."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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


def readme_blocks(name: str) -> list[tuple[str, str]]:
    """(language, text) of the README's fenced blocks between `<!-- NAME: begin (...) -->`
    and `<!-- NAME: end -->`: a test runs what the reader reads, so the two cannot drift
    (tests/accessor/test_public_face.py checks that every block has such a test)."""
    section = README.read_text().split(f"<!-- {name}: begin")[1].split(f"<!-- {name}: end")[0]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
