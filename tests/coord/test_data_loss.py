"""A single-replica pchannel whose only copy lost acknowledged records, through the coord.

The owner is killed and bytes in the middle of its newest WAL file are inverted. When it
comes back, the coord must not serve the pchannel as if whole, nor move it to the other
node (a copy of the damaged log would hide the loss there): `channel describe` shows
DATA_LOSS with the cause, and nothing is served until `channel accept-loss`, after which
the pchannel continues above every acknowledged offset, on the node that holds its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamwal.client.wal import open_wal
from streamwal.coord import state_machine as sm
from streamwal.errors import DataLoss
from streamwal.testing.local_cluster import LocalCluster
from tests.node.test_corruption import flip_middle, newest
from tests.support import wait_for

STREAMWAL = str(Path(sys.executable).parent / "streamwal")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([STREAMWAL, "channel", *args], capture_output=True, text=True, timeout=60)


async def test_a_lost_single_copy_waits_for_accept_loss_and_never_reuses_an_offset(
    tmp_path,
) -> None:
    # a grace long enough that the owner is back before it would be failed over uncleanly
    cluster = LocalCluster(tmp_path, nodes=2, probe_interval=0.2, grace=10.0)
    wal = None
    try:
        await cluster.start()
        (name,) = await cluster.create_channels(1, prefix="single")
        wal = await open_wal(cluster.coord_address, failover_timeout=30)
        producer = await wal.producer(name)
        acked = [(await producer.send(os.urandom(1000))).offset for _ in range(3000)]
        await producer.close()
        owner = (await cluster.describe())[name].meta.node.server_id

        cluster.kill_node(owner)
        flip_middle(newest(cluster.nodes[owner].data_dir, ".log"))
        await cluster.start_node(owner)

        async def lost() -> bool:
            return bool((await cluster.describe())[name].data_loss)

        await wait_for(lost, 20, 0.1, "the coord to report the loss")
        shown = cli("describe", "--coord", cluster.coord_address, name)
        assert shown.returncode == 0, shown.stderr
        assert "DATA_LOSS" in shown.stdout
        assert "acknowledged" in shown.stderr
        await asyncio.sleep(2.0)  # rounds go by: it is neither served nor moved
        d = (await cluster.describe())[name]
        assert d.meta.state == sm.UNAVAILABLE
        assert d.meta.node.server_id == owner
        # A client waiting for an owner is told why none comes, at once (not after its
        # 30 s failover wait), whichever way it asks.
        for attempt in (wal.producer(name), wal.consumer(name), wal.end_offset(name)):
            started = time.monotonic()
            with pytest.raises(DataLoss, match="acknowledged"):
                await attempt
            assert time.monotonic() - started < 5

        accepted = cli("accept-loss", "--coord", cluster.coord_address, name)
        assert accepted.returncode == 0, accepted.stderr
        d = (await cluster.describe())[name]
        assert not d.data_loss and d.meta.state == sm.ASSIGNED
        assert d.meta.node.server_id == owner
        producer = await wal.producer(name)
        after = await producer.send(b"after the loss")
        await producer.close()
        assert after.offset > max(acked)
    finally:
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
        await cluster.close()
