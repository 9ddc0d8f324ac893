"""The coord's node calls batched per node (coord/node_link.Coalescer), over a fake send."""

from __future__ import annotations

import asyncio

import pytest

from streamwal.coord.node_link import Coalescer
from streamwal.errors import ChannelNotExist, StreamingError, Unavailable


async def test_calls_for_a_node_made_together_travel_in_one_batch_each_with_its_answer():
    sent: list[tuple[str, list[str], float]] = []

    async def send(address: str, requests: list, timeout: float) -> list:
        sent.append((address, list(requests), timeout))
        return [ChannelNotExist(r) if r.startswith("gone") else f"ok {r}" for r in requests]

    batches = Coalescer(send, window=0.01, limit=3)
    calls = [
        batches.call("n1", "a", 1.0),
        batches.call("n2", "b", 1.0),
        batches.call("n1", "gone-c", 2.5),
        batches.call("n1", "d", 1.0),
        batches.call("n1", "e", 1.0),  # past the limit: the next batch
    ]
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[:2] == ["ok a", "ok b"] and got[3:] == ["ok d", "ok e"]
    assert isinstance(got[2], ChannelNotExist)  # its own error, the others unaffected
    # one call per node and window; the batch's deadline is its longest item's
    assert sorted(sent) == [
        ("n1", ["a", "gone-c", "d"], 2.5),
        ("n1", ["e"], 1.0),
        ("n2", ["b"], 1.0),
    ]


async def test_a_failed_batch_call_fails_each_item_and_a_cancelled_caller_leaves_the_rest():
    release = asyncio.Event()

    async def send(address: str, requests: list, timeout: float) -> list:
        await release.wait()
        if address == "down":
            raise Unavailable("DEADLINE_EXCEEDED")
        return list(requests)

    batches = Coalescer(send, window=0.0)
    down = [asyncio.ensure_future(batches.call("down", r, 1.0)) for r in "xy"]
    up = [asyncio.ensure_future(batches.call("up", r, 1.0)) for r in "pq"]
    await asyncio.sleep(0.01)
    up[0].cancel()  # its caller gave up (the saga's task was cancelled)
    release.set()
    for call in down:
        with pytest.raises(StreamingError, match="DEADLINE_EXCEEDED"):
            await call
    assert await up[1] == "q"
    assert up[0].cancelled()
