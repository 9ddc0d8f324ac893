"""A Scanner across kill -9 of its pchannel's owner: it follows the pchannel to its next
owner and resumes after the last delivered message: no gap, no duplicate."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamwal.client.aio import DeliverPolicy, Message, connect
from tests.support import wait_for


@pytest.mark.slow
async def test_scanner_follows_a_kill_9_of_the_owner_without_gap_or_duplicate(
    make_cluster,
) -> None:
    cluster = await make_cluster(nodes=2, grace=10.0)
    (pchannel,) = await cluster.create_channels(1)
    vchannel, other = f"{pchannel}_scan", f"{pchannel}_noise"
    async with await connect(coord=cluster.coord_address, failover_timeout=60) as wal:
        delivered = []
        scanner = wal.read(vchannel, DeliverPolicy.all(), handler=delivered.append)
        acked: list[int] = []
        stop = asyncio.Event()

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                # Interleave another vchannel: the scanner must filter it out.
                await wal.append_messages(Message(vchannel, b"%d" % i), Message(other, b"x"))
                acked.append(i)
                i += 1

        work = asyncio.create_task(produce())
        await wait_for(lambda: len(delivered) >= 200, 30, what="200 delivered before the kill")
        owner = wal.wal.assignments()[pchannel]
        cluster.kill_node(owner.server_id)  # SIGKILL mid-read and mid-produce
        killed_at = time.monotonic()
        await asyncio.sleep(0.5)
        await cluster.start_node(owner.server_id)
        await wait_for(
            lambda: getattr(wal.wal.assignments().get(pchannel), "term", 0) > owner.term,
            60,
            what="the pchannel under a new term",
        )
        await wait_for(lambda: len(acked) >= len(delivered) + 100 or len(acked) > 1500, 60)
        stop.set()
        await asyncio.wait_for(work, 60)
        await wait_for(lambda: len(delivered) >= len(acked), 60, what="every ack delivered")
        print(
            f"\nscanner: {len(delivered)} delivered, reopened {scanner.consumer.reopens}x, "
            f"pchannel back {time.monotonic() - killed_at:.1f}s after the kill"
        )
        assert scanner.error() is None
        assert scanner.consumer.reopens >= 1, "the scanner never saw the failover"
        assert [int(m.payload) for m in delivered] == acked  # no gap, no duplicate, in order
        assert {m.vchannel for m in delivered} == {vchannel}
        offsets = [m.offset for m in delivered]
        assert offsets == sorted(set(offsets))
        await scanner.close()
