"""Channels built by common/transport.py against a real node process."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.node_client import NodeClient
from streamwal.testing.local_node import LocalNode
from streamwal.transport import CONNECT_TIMEOUT_MS


async def test_a_node_that_stalls_briefly_is_still_reached_by_a_new_client(
    tmp_path,
) -> None:
    """A node frozen for 0.4 s (as a CPU-throttled pod can be) while a new client
    connects: the call waits for the handshake instead of failing with UNAVAILABLE
    ("timed out before receiving SETTINGS frame", which it did at a 100 ms connect
    timeout)."""
    node = LocalNode(tmp_path / "node", node_id=1).start()
    try:
        node.pause()
        resume = asyncio.get_running_loop().call_later(0.4, node.resume)
        started = time.monotonic()
        try:
            async with NodeClient(node.address) as client:
                status = await client.collect_status()
        finally:
            resume.cancel()
            node.resume()
        waited = time.monotonic() - started
        assert list(status.channels) == []  # a new node: answered, nothing assigned
        assert 0.3 < waited < CONNECT_TIMEOUT_MS / 1000
    finally:
        node.kill()
