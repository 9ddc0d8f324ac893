"""What operators and users see of replication: metrics, the CLI's --ack-level, the sync
client's ack_level."""

from __future__ import annotations

import asyncio
import json

from streamwal.client.node_client import NodeClient
from streamwal.client.sync import SyncNodeClient
from streamwal.testing.local_node import free_port
from tests.node.helpers import sample, scrape
from tests.node.test_cli import run
from tests.replication.helpers import assign_replicas, status
from tests.support import wait_for


async def test_metrics_cli_and_sync_client(start_node, pchannel) -> None:
    port = free_port()
    leader = start_node("n1", "--metrics", f"127.0.0.1:{port}", node_id=1)
    nodes = [leader, start_node("n2", node_id=2), start_node("n3", node_id=3)]
    clients = {n.node_id: NodeClient(n.address) for n in nodes}
    try:
        await assign_replicas(clients, nodes, pchannel, 1, leader)
        out = run(
            "produce", "--node", leader.address, "--pchannel", pchannel, "--term", "1",
            "--count", "500", "--ack-level", "quorum", "--no-progress",
        )  # fmt: skip
        assert json.loads(out.stdout.strip().splitlines()[-1])["messages"] == 500
        with (
            SyncNodeClient(leader.address) as sync,
            sync.producer(pchannel, 1, ack_level="leader") as producer,
        ):
            last = producer.send(b"sync").offset

        async def settled():
            s = await status(clients[1], pchannel)
            return s.commit_offset > last and all(r.lag == 0 for r in s.replicas)

        await wait_for(settled, 15, 0.1, "followers caught up")
        s = await status(clients[1], pchannel)
        samples = scrape(port)
        assert sample(samples, "streamwal_replica_role", pchannel=pchannel, role="leader") == 1
        assert sample(samples, "streamwal_commit_offset", pchannel=pchannel) > last
        for r in s.replicas:
            labels = {"pchannel": pchannel, "replica": str(r.node_id)}
            assert sample(samples, "streamwal_replica_acked_offset", **labels) > last
            assert sample(samples, "streamwal_replica_lag", **labels) < 10  # a tick or two
        # Idle past the quorum lease (1 s), no reader taking ticks: no tick is written
        # (they cost per reader, not per pchannel) and the followers' heartbeats keep
        # the leader healthy (it used to hear them through the ticks' acks).
        await asyncio.sleep(1.6)
        idle = await status(clients[1], pchannel)
        assert idle.unhealthy == "", idle.unhealthy
        assert idle.next_offset == s.next_offset, "idle ticks without a reader"
    finally:
        for c in clients.values():
            await c.close()
