"""A follower that joins with an empty disk catches a long log up from the leader's disk,
in bounded chunks, while the leader keeps answering its producers."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.node_client import NodeClient
from streamwal.node import records
from streamwal.node.replication_links import REPLICATE
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import make_internal_channel
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


async def _follow_raw(leader_address: str, pchannel: str, batched: bool, end: int) -> list:
    """Replicate as follower 3 would, from offset 0, until `end`: the LogEntries got."""
    channel = await make_internal_channel(leader_address)
    try:
        call = channel.stream_stream(
            REPLICATE,
            request_serializer=pb.ReplicaAck.SerializeToString,
            response_deserializer=pb.LogEntry.FromString,
        )()
        first = pb.ReplicaAck(pchannel=pchannel, term=1, node_id=3, replica=2, batched=batched)
        await call.write(first)
        entries, at = [], 0
        while at < end:
            entry = await asyncio.wait_for(call.read(), 10)
            entries.append(entry)
            for value in [entry.record, *entry.next_records] if entry.record else []:
                at += records.peek(value)[2]
        call.cancel()
        return entries
    finally:
        await channel.close()


async def test_a_catching_up_follower_gets_many_records_per_entry(start_node, pchannel) -> None:
    """A follower whose first ack says `batched` gets the records it misses packed into
    few LogEntries (one stream message per read: a 20,000-record catch-up took 4 s one
    message at a time); one that does not say so (an older version, which would drop
    `next_records` unseen) gets one record per entry. The same records either way."""
    leader, follower = start_node("n1", node_id=1), start_node("n2", node_id=2)
    nodes = [leader, follower, start_node("n3", node_id=3)]
    async with NodeClient(leader.address) as c1, NodeClient(follower.address) as c2:
        await assign_replicas({1: c1, 2: c2}, nodes, pchannel, 1, leader)
        producer = await c1.producer(pchannel, 1, ack_level="quorum")
        for i in range(300):  # one record each
            await producer.send(b"m%d" % i)
        end = (await status(c1, pchannel)).next_offset
        await producer.close()

        def offsets(entries: list) -> list[int]:
            out = []
            for e in entries:
                at = e.offset
                for value in [e.record, *e.next_records] if e.record else []:
                    out.append(at)
                    at += records.peek(value)[2]
            return out

        packed = await _follow_raw(leader.address, pchannel, True, end)
        single = await _follow_raw(leader.address, pchannel, False, end)
        assert offsets(packed) == offsets(single) == list(range(end))
        assert len([e for e in packed if e.record]) <= 3, len(packed)
        assert all(not e.next_records for e in single)
