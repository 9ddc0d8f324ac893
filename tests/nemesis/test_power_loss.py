"""Coordinated power loss: every node and the coord lose what they had not fsync'ed.

Each node's data dir and the coord's meta dir are lazyfs mounts (`lazyfs.py`: unsynced
file data, and directory entries whose directory was not fsync'ed, are dropped on
"power loss"). Producers write to a 3-replica and a 1-replica pchannel; then every
process is SIGKILLed at once, every mount loses its unsynced state, and the cluster
restarts on what is left.

- ``--durability sync`` promises that an acknowledged message was fsync'ed: none may be
  lost, none may be acknowledged twice (also after new writes), replicas agree.
- ``--durability async`` acknowledges once the OS has the write: it survives kill -9,
  not a power loss. The test measures how many acknowledged messages a power loss takes
  (and over how many seconds before it) and whether the restarted cluster hands their
  offsets out again; it asserts only that the cluster serves again. (On 3 nodes, where
  followers write synced and so sync the leader's WAL too, it runs in the long schedule.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from streamwal.client.wal import WAL, open_wal
from streamwal.testing.history import acked_twice
from tests.nemesis.history import Producers, lost, read_from_start

GRACE = 1.0
PROBE = 0.2


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("durability", "nodes"), [("sync", 3), ("async", 3), ("async", 1)])
async def test_power_loss_on_every_node_at_once(nemesis, durability: str, nodes: int) -> None:
    if (durability, nodes) == ("async", 3) and not nemesis.long:
        pytest.skip("the long schedule measures async durability on 3 nodes (--nemesis-long)")
    mounts = [nemesis.lazy_mount(nemesis.root / f"node{i}") for i in range(1, nodes + 1)]
    mounts.append(nemesis.lazy_mount(nemesis.root / "meta"))
    cluster = nemesis.cluster(
        nodes, node_args=("--durability", durability), grace=GRACE, probe_interval=PROBE
    )
    await cluster.start()
    names = await cluster.create_channels(1, prefix="plr1", replicas=1)
    if nodes == 3:
        names += await cluster.create_channels(1, prefix="plr3", replicas=3)
    wal: WAL | None = None
    try:
        wal = await open_wal(cluster.coord_address, failover_timeout=5)
        for name in names:
            await wal.resolve(name, timeout=30)
        await cluster.wait_healthy(names)
        before = {name: Producers(wal, name).start() for name in names}
        for work in before.values():
            await work.wait_acks(200, timeout=60)
        await asyncio.sleep(nemesis.rng.uniform(0.5, 2.0))

        cluster.kill_all()
        crashed_at = time.monotonic()
        drops = [m.power_loss() for m in mounts]
        for work in before.values():
            await work.stop(timeout=1.0)
        files, entries = sum(len(d["files"]) for d in drops), sum(d["entries"] for d in drops)
        print(f"power loss: {files} files and {entries} directory entries unsynced")

        await cluster.start()
        await cluster.wait_healthy(names, timeout=60)
        after = {name: Producers(wal, name, name="q").start() for name in names}
        for work in after.values():
            await work.wait_acks(50, timeout=30)  # writes flow again
            await work.stop()

        results = {}
        for name in names:
            acked_before = before[name].acked
            acked = [*acked_before, *after[name].acked]
            log = dict(await read_from_start(wal, name))
            gone = lost(acked_before, log)
            gone_set = set(gone)
            lost_acks = [
                acked_at
                for (_, acked_at), a in zip(before[name].ack_times, acked_before, strict=True)
                if a in gone_set
            ]
            window = max(0.0, crashed_at - min(lost_acks, default=crashed_at))
            twice = acked_twice(acked)
            verdict = await cluster.check(name, acked)
            results[name] = (acked_before, gone, window, twice, verdict)
            print(
                f"{durability} {name}: {len(acked_before)} acknowledged before the power loss, "
                f"{len(gone)} lost (acknowledged within {window:.2f}s before it), "
                f"{len(twice)} offsets acknowledged twice after; {verdict.summary()[:2000]}"
            )
        if durability == "sync":
            for name, (_, gone, _, twice, verdict) in results.items():
                assert not gone, f"{name}: acknowledged messages lost: {gone[:10]}"
                assert not twice, f"{name}: {twice[:10]}"
                assert verdict.ok, f"{name}: {verdict.summary()}"
    finally:
        if wal is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(wal.close(), 10)
