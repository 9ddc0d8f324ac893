"""The producer's bounds against a real node that is paused (SIGSTOP), on both transports.

A paused node keeps its connections open and its kernel still acknowledges TCP, so only
the producer's own bounds notice it: the request deadline (something on the wire), the
keepalive ping (a quiet stream), the bounded open and close. Each bound is checked both
ways: a live node is never given up (its pings are answered), a paused one is, with an
error that names the bound, within the bound plus a generous margin for a loaded machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.errors import Unavailable
from streamwal.testing.local_node import LocalNode

MARGIN = 5.0  # seconds past a bound a loaded 2-core machine may need to notice it
PCHANNEL = "bounds-0"
TRANSPORTS = {"produce port": True, "gRPC": False}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalNode]:
    node = LocalNode(tmp_path / "n1", extra_args=("--log-level", "warning")).start(timeout=60)
    try:
        yield node
    finally:
        node.resume()
        node.kill()


@pytest.fixture(params=TRANSPORTS.keys())
async def client(node: LocalNode, request: pytest.FixtureRequest) -> AsyncIterator[NodeClient]:
    async with NodeClient(node.address, produce_port=TRANSPORTS[request.param]) as c:
        await c.wait_ready(30)
        await c.assign(PCHANNEL, 1)
        yield c


async def _fails_within(awaitable, bound: float) -> tuple[Unavailable, float]:
    started = time.monotonic()
    with pytest.raises(Unavailable) as failed:
        await asyncio.wait_for(awaitable, bound + MARGIN)
    return failed.value, time.monotonic() - started


async def test_a_request_unanswered_past_its_deadline_fails_clearly(
    node: LocalNode, client: NodeClient
) -> None:
    producer = await client.producer(PCHANNEL, 1, request_timeout=1.0, keepalive_interval=60)
    await producer.send(b"before")
    node.pause()
    err, waited = await _fails_within(producer.send(b"to a paused node"), 1.0)
    assert "request_timeout 1s" in str(err) and waited >= 1.0
    assert producer.broken.is_set()
    with pytest.raises(Unavailable):  # the stream is over: later sends fail at once
        await producer.send(b"after")
    await producer.abandon()


async def test_a_quiet_stream_lives_on_answered_pings_and_dies_without_them(
    node: LocalNode, client: NodeClient
) -> None:
    producer = await client.producer(
        PCHANNEL, 1, keepalive_interval=0.2, keepalive_timeout=0.3, request_timeout=30
    )
    await producer.send(b"one")
    await asyncio.sleep(1.5)  # several pings, each answered by the node
    assert not producer.broken.is_set(), producer.error
    await producer.send(b"two")
    node.pause()
    started = time.monotonic()
    await asyncio.wait_for(producer.broken.wait(), 0.5 + MARGIN)
    assert time.monotonic() - started >= 0.3
    assert "keepalive_timeout 0.3s" in str(producer.error)
    with pytest.raises(Unavailable, match="keepalive"):
        await producer.send(b"three")
    await producer.abandon()


async def test_close_is_bounded_and_fails_what_is_left(node: LocalNode, client: NodeClient) -> None:
    producer = await client.producer(PCHANNEL, 1, request_timeout=60)
    await producer.send(b"before")
    node.pause()
    stuck = asyncio.ensure_future(producer.send(b"never answered"))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await asyncio.wait_for(producer.close(timeout=0.5), 0.5 + MARGIN)
    assert time.monotonic() - started >= 0.5
    with pytest.raises(Unavailable, match="closed before the node answered"):
        await stuck
    with pytest.raises(Unavailable, match="closed"):
        await producer.send(b"after close")


async def test_opening_a_producer_on_a_paused_node_is_bounded(node: LocalNode) -> None:
    for produce_port in TRANSPORTS.values():
        async with NodeClient(node.address, produce_port=produce_port) as c:
            await c.wait_ready(30)
            await c.assign(PCHANNEL, 1)
            node.pause()
            err, _ = await _fails_within(c.producer(PCHANNEL, 1, request_timeout=1.0), 1.0)
            assert "request_timeout" in str(err)
            node.resume()
