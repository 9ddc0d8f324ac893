"""Every python example of docs/api.md runs, as a user would run it, against a real
embedded cluster (coord + nodes) found through STREAMWAL_COORD."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", API_MD.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_has_an_example_per_feature() -> None:
    text = "\n".join(BLOCKS)
    for feature in ("raw_append(", "barrier_time_tick=", "broadcast()", "ResourceKey(",
                    "wal.read(", "append_messages(", "msg_stream()", "tt_msg_stream()",
                    "seek(", "asyncio.run(", "wal.txn(",
                    "as_consumer(channels, \"workers\")", "consumer_group(",
                    "describe_groups("):  # fmt: skip
        assert feature in text, f"docs/api.md has no example of {feature}"


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
async def test_example_runs(cluster, index: int) -> None:
    await _run(cluster, index)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_broadcast_example_runs_twice_in_a_row(cluster) -> None:
    """Its resource key is released at the end: a second run is not refused."""
    (index,) = [i for i, b in enumerate(BLOCKS) if "ResourceKey(" in b]
    await _run(cluster, index)
    await _run(cluster, index)


async def _run(cluster, index: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BLOCKS[index],
        env={**os.environ, "STREAMWAL_COORD": cluster.coord_address},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, f"example {index}:\n{BLOCKS[index]}\n{out.decode()}{err.decode()}"
