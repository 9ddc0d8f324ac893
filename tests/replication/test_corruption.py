"""A minority replica whose store lost acknowledged records never leads and is rebuilt.

Real processes: a coord and 3 nodes. Every message is acknowledged at quorum and all
three logs agree; then one follower is killed, bytes in the middle of its newest WAL
file (or of a table file) are inverted, the leader is killed for good and the damaged
follower restarts. The damaged follower must not be chosen (its Fence answer says what it lost), the
healthy follower leads, a reader from the start gets every acknowledged message, and the
damaged follower ends with the same log as the new leader (a damaged table file is
salvaged before the node serves, then what it lost is copied back).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
from rocksdict import Options, Rdict

from streamwal.client.policy import DeliverPolicy
from streamwal.client.routing import RoutedConsumer
from streamwal.client.wal import open_wal
from streamwal.coord import state_machine as sm
from streamwal.errors import StreamingError
from streamwal.testing.local_cluster import LocalCluster
from tests.node.test_corruption import flip_middle, newest
from tests.replication.helpers import raw_log
from tests.support import wait_for

MESSAGES = 2000


async def _identical(addresses: list[str], name: str) -> bool:
    try:
        logs = await asyncio.gather(*(raw_log(a, name) for a in addresses))
    except StreamingError:  # a damaged replica refuses Fetch until rebuilt
        return False
    return bool(logs[0]) and all(log == logs[0] for log in logs)


@pytest.mark.parametrize("damaged_file", [".log", ".sst"])
async def test_a_corrupted_follower_never_leads_and_is_rebuilt(tmp_path, damaged_file) -> None:
    cluster = LocalCluster(tmp_path, nodes=3, probe_interval=0.2, grace=1.0)
    wal = None
    try:
        await cluster.start()
        (name,) = await cluster.create_channels(1, prefix="corrupt", replicas=3)
        wal = await open_wal(cluster.coord_address, failover_timeout=30)
        await wal.resolve(name, timeout=30)
        producer = await wal.producer(name)
        acked = {}
        for i in range(MESSAGES):
            payload = f"m{i}:".encode() + os.urandom(500)
            acked[(await producer.send(payload)).offset] = payload
        await producer.close()

        d = (await cluster.describe())[name]
        leader = d.meta.node.server_id
        damaged, healthy = [m.server_id for m in d.members if m.server_id != leader]
        everyone = [cluster.node_address(n) for n in (leader, damaged, healthy)]
        await wait_for(lambda: _identical(everyone, name), 30, 0.2, "identical logs")

        cluster.kill_node(damaged)
        data_dir = cluster.nodes[damaged].data_dir
        if damaged_file == ".sst":  # what a memtable flush would have left on disk
            db = Rdict(str(data_dir), Options(raw_mode=True))
            db.flush()
            db.close()
        flip_middle(newest(data_dir, damaged_file))
        cluster.kill_node(leader)  # for good: the damaged copy must not replace it
        await cluster.start_node(damaged)

        async def new_leader() -> bool:
            meta = (await cluster.describe())[name].meta
            return meta.state == sm.ASSIGNED and meta.node.server_id != leader

        await wait_for(new_leader, 30, 0.1, "a new leader")
        assert (await cluster.describe())[name].meta.node.server_id == healthy
        events = cluster.coord_events("pchannel assigned", "failover done")
        assert damaged not in {e.get("new_node") for e in events}

        consumer = RoutedConsumer(wal.router, name, DeliverPolicy.all())
        await consumer.open()
        seen: dict[int, bytes] = {}
        try:
            async with asyncio.timeout(30):
                while not set(acked) <= set(seen):
                    batch = await consumer.next_batch()
                    assert batch is not None
                    seen.update((m.offset, m.payload) for m in batch if m.payload)
        finally:
            with contextlib.suppress(StreamingError):
                await consumer.close()
        assert all(seen[o] == p for o, p in acked.items())

        survivors = [cluster.node_address(n) for n in (healthy, damaged)]
        await wait_for(lambda: _identical(survivors, name), 30, 0.2, "the follower rebuilt")
    finally:
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
        await cluster.close()
