"""A single-copy PChannel whose node lost acknowledged records, on the real API server.

The node is killed, bytes in the middle of its newest WAL file are inverted, and it comes
back: the operator must report it (Ready=False, reason DataLoss, a Warning Event), serve
nothing, and serve it again only after `kubectl annotate ... accept-data-loss=true`,
above every acknowledged offset; the annotation is removed once carried out.
"""

from __future__ import annotations

import asyncio
import os

from streamwal.client.node_client import NodeClient
from tests.node.test_corruption import flip_middle, newest
from tests.operator.conftest import Cluster, pchannel_yaml, wait_for


async def _produce(address: str, name: str, term: int, count: int) -> list[int]:
    async with NodeClient(address) as c:
        producer = await c.producer(name, term)
        results = await producer.send_many([os.urandom(1000) for _ in range(count)])
        await producer.close()
    return [r.offset for r in results]


def test_a_lost_single_copy_says_data_loss_until_accepted(cluster: Cluster) -> None:
    node = cluster.add_node(1)
    cluster.start_operator("--grace", "30")  # the restart below is not a failover
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-loss"))
    before = wait_for(lambda: cluster.ready("ch-loss"), 30, "ch-loss Ready")["status"]
    acked = asyncio.run(_produce(node.address, "ch-loss", before["term"], 3000))

    node.kill()
    flip_middle(newest(node.data_dir, ".log"))
    node.start()

    def lost() -> dict | None:
        status = (cluster.get("ch-loss") or {}).get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        return status if cond.get("reason") == "DataLoss" else None

    status = wait_for(lost, 30, "the DataLoss condition")
    assert status["conditions"][0]["status"] == "False"
    assert "accept-data-loss=true" in status["conditions"][0]["message"]
    assert wait_for(lambda: [e for e in cluster.events("ch-loss") if e.reason == "DataLoss"], 10)

    cluster.kubectl("annotate", "pch", "ch-loss", "streamwal.io/accept-data-loss=true")
    after = wait_for(lambda: cluster.ready("ch-loss"), 30, "ch-loss served again")["status"]
    assert after["term"] > before["term"]
    more = asyncio.run(_produce(node.address, "ch-loss", after["term"], 1))
    assert more[0] > max(acked)
    annotations = wait_for(
        lambda: (
            "streamwal.io/accept-data-loss"
            not in ((cluster.get("ch-loss") or {})["metadata"].get("annotations") or {})
            and cluster.get("ch-loss")
        ),
        10,
        "the annotation removed",
    )
    assert annotations
    assert not cluster.forbidden()
