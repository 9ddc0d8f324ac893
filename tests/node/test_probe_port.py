"""The probe port answers while the node's event loop is busy, and says how long it was.

This is the first half of issue 24's "liveness that work cannot starve": the coord's
pings (coord/pinger.py) reach threads of the node's own, so a loop blocked by data or
recovery work for longer than the probe deadline does not look like a dead node; a loop
wedged beyond the coord's bound does fail the pings (alive is not serving).
"""

from __future__ import annotations

import asyncio
import time

from streamwal.coord.pinger import Pinger
from streamwal.node.probe_port import ProbePort


async def _heard(pinger: Pinger, within: float) -> list:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        heard = pinger.drain()
        if heard:
            return heard
        await asyncio.sleep(0.02)
    raise TimeoutError("no ping outcome")


async def test_pings_answer_while_the_loop_is_blocked_and_a_stall_fails_them():
    port = ProbePort(node_id=7)
    await port.start("127.0.0.1:0")
    pinger = Pinger(interval=0.1, max_stall=0.5)
    pinger.start()
    try:
        pinger.watch(7, f"127.0.0.1:{port.port}")
        assert [h.ok for h in await _heard(pinger, 2.0)] == [True]
        # Block the node's (here: this test's) loop for 0.4 s: pings keep arriving, ok.
        began = time.monotonic()
        time.sleep(0.4)
        heard = pinger.drain()
        assert heard and all(h.ok for h in heard)
        assert all(h.at - began < 0.45 for h in heard)  # answered during the block
        # Wedge it beyond the bound (0.5 s): the pings say so.
        time.sleep(0.9)
        heard = pinger.drain()
        assert heard and not heard[-1].ok
        assert (await _heard(pinger, 2.0))[-1].ok  # turning again
        # A different node on that port (an address reused) is not node 7.
        pinger.watch(8, f"127.0.0.1:{port.port}")
        await asyncio.sleep(0.3)
        assert {h.node for h in pinger.drain() if not h.ok} == {8}
        # A dead port fails fast. A ping in flight when it stopped may still come back
        # answered (its deadline is 2 intervals): those outcomes are dropped first.
        await port.stop()
        await asyncio.sleep(0.25)
        pinger.drain()
        await asyncio.sleep(0.4)
        assert {h.ok for h in pinger.drain()} == {False}
    finally:
        await asyncio.to_thread(pinger.stop)
        await port.stop()
