"""A follower that joins with an empty disk catches a long log up from the leader's disk,
in bounded chunks, while the leader keeps answering its producers."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.node_client import NodeClient
from tests.replication.helpers import assign_replicas, status, wait_identical

MESSAGES = 200_000


async def test_empty_follower_catches_up_while_producers_go_on(start_node, pchannel) -> None:
    leader, follower = start_node("n1", node_id=1), start_node("n2", node_id=2)
    late = start_node("n3", node_id=3)
    nodes = [leader, follower, late]
    async with NodeClient(leader.address) as c1, NodeClient(follower.address) as c2:
        await assign_replicas({1: c1, 2: c2}, nodes, pchannel, 1, leader)  # n3 not yet
        producer = await c1.producer(pchannel, 1, ack_level="quorum")
        payload = b"x" * 100
        await asyncio.gather(
            *(producer.send_many([payload] * 1000) for _ in range(MESSAGES // 1000))
        )
        end = (await status(c1, pchannel)).next_offset
        assert end >= MESSAGES

        async with NodeClient(late.address) as c3:
            started = time.monotonic()
            await assign_replicas({3: c3}, nodes, pchannel, 1, leader)
            batches = 0
            caught_up_at = None
            while time.monotonic() - started < 60:
                await asyncio.wait_for(producer.send_many([b"during"] * 100), 10)
                batches += 1
                acked = {r.node_id: r.acked_offset for r in (await status(c1, pchannel)).replicas}
                if acked.get(3, 0) >= end:
                    caught_up_at = time.monotonic()
                    break
            assert caught_up_at is not None, "the new follower did not catch up within 60 s"
            # the producer went on while ~20 MB were copied: it is not stalled by catch-up
            assert batches >= 5, f"only {batches} quorum batches during the catch-up"
            print(
                f"caught up {end} messages in {caught_up_at - started:.1f}s "
                f"while {batches} quorum batches completed"
            )
        await producer.close()
        await wait_identical([n.address for n in nodes], pchannel, timeout=60)
