"""Broadcast with real processes: a coord and three nodes (`LocalCluster`) on loopback.

What a user relies on: a broadcast lands on every target vchannel exactly once, also when
a node or the coord is killed midway; resource keys exclude conflicting broadcasts until
the holder is acked everywhere; shared keys coexist; the block_until calls wait for acks;
bad acks get clear typed errors.
"""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from streamwal.client.broadcast import BroadcastClient, SyncBroadcastClient
from streamwal.client.wal import open_wal
from streamwal.coord import state_machine as sm
from streamwal.errors import (
    BroadcastNotFound,
    ChannelNotExist,
    InvalidArgument,
    ResourceKeyConflict,
)
from streamwal.message import PROP_BROADCAST_ID, ResourceKey
from streamwal.testing.local_cluster import LocalCluster, free_port
from tests.support import wait_for

KEY = ResourceKey("collection", "c1")


async def _spread_cluster(
    root, grace: float = 1.5, allow_data_loss: bool = False
) -> tuple[LocalCluster, list[str]]:
    """Three nodes, three pchannels, one per node."""
    cluster = LocalCluster(
        root,
        nodes=3,
        grace=grace,
        log_level="warning",
        coord_args=("--metrics", f"127.0.0.1:{free_port()}"),
    )
    await cluster.start()
    channels = await cluster.create_channels(3, allow_data_loss=allow_data_loss)

    async def spread():
        described = await cluster.describe()
        nodes = {d.meta.node.server_id for d in described.values() if d.meta.state == sm.ASSIGNED}
        return described if len(nodes) == 3 else None

    await wait_for(spread, 20, what="three pchannels on three nodes")
    return cluster, channels


@pytest.fixture
async def spread(tmp_path):
    cluster, channels = await _spread_cluster(tmp_path / "c")
    try:
        yield cluster, channels
    finally:
        await cluster.close()


async def broadcast_copies(coord: str, pchannels: list[str]) -> dict[str, list[tuple]]:
    """{pchannel: [(vchannel, broadcast id, offset)]} of every broadcast copy in the log."""
    out: dict[str, list[tuple]] = {}
    async with await open_wal(coord, failover_timeout=30) as wal:
        for pchannel in pchannels:
            end = await wal.end_offset(pchannel)
            out[pchannel] = []
            if end == 0:
                continue
            async with await wal.consumer(pchannel, end_offset=end) as consumer:
                async for m in consumer:
                    bid = m.properties.get(PROP_BROADCAST_ID)
                    if bid is not None:
                        out[pchannel].append((m.vchannel, int(bid), m.offset))
    return out


async def coord_metric(cluster: LocalCluster, name: str) -> float:
    """One sample of the coord's Prometheus text (0 when absent)."""
    address = cluster.coord_args[cluster.coord_args.index("--metrics") + 1]
    url = f"http://{address}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def assert_exactly_once(copies: dict[str, list[tuple]], result) -> None:
    """Every target holds one copy, at the offset the append answered; nothing else."""
    found = sorted((v, b, o) for entries in copies.values() for v, b, o in entries)
    expected = sorted((v, result.broadcast_id, r.offset) for v, r in result.results.items())
    assert found == expected


@pytest.mark.slow
async def test_node_killed_midway_broadcast_lands_everywhere_exactly_once(tmp_path):
    # The lost node's pchannel may fail over without its records (it holds none here):
    # otherwise it would wait for the node, and the broadcast with it.
    cluster, channels = await _spread_cluster(tmp_path / "c", grace=2.0, allow_data_loss=True)
    try:
        described = await cluster.describe()
        victim = described[channels[2]].meta.node.server_id
        vchannels = [f"{p}_v1" for p in channels] + [f"{channels[0]}_v2"]
        cluster.kill_node(victim)  # SIGKILL
        async with BroadcastClient(cluster.coord_address) as b:
            append = asyncio.create_task(b.append(b"drop c1", vchannels, [KEY]))

            async def live_copies_landed():
                copies = await broadcast_copies(cluster.coord_address, channels[:2])
                return sum(len(c) for c in copies.values()) == 3

            # Midway: the copies on the live nodes are durable, the third one is not.
            await wait_for(live_copies_landed, 20, interval=0.1, what="copies on live nodes")
            assert not append.done()
            # The coord keeps retrying; the pchannel fails over, the broadcast lands there.
            result = await asyncio.wait_for(append, 60)
        await cluster.start_node(victim)  # the killed node comes back: it must add nothing

        async def all_assigned():
            described = await cluster.describe()
            return all(described[p].meta.state == sm.ASSIGNED for p in channels)

        await wait_for(all_assigned, 20, what="every pchannel assigned")
        assert sorted(result.results) == sorted(vchannels)
        assert_exactly_once(await broadcast_copies(cluster.coord_address, channels), result)
        assert await coord_metric(cluster, "streamwal_coord_broadcast_append_retries_total") > 0
        assert await coord_metric(cluster, 'streamwal_coord_broadcast_tasks{state="done"}') == 1
    finally:
        await cluster.close()


@pytest.mark.slow
async def test_node_killed_amid_a_stream_of_broadcasts_each_lands_exactly_once(tmp_path):
    """SIGKILL while broadcasts are in flight; the node restarts as a StatefulSet pod
    would (within the grace period: no failover) and the coord's retries complete every
    broadcast once. (A resend of a batch the node wrote but did not answer is answered,
    not appended again: the coord-crash test pins that window deterministically.)"""
    cluster, channels = await _spread_cluster(tmp_path / "c", grace=10.0)
    try:
        described = await cluster.describe()
        victim = described[channels[1]].meta.node.server_id
        vchannels = [f"{p}_v1" for p in channels]
        async with BroadcastClient(cluster.coord_address) as b:
            appends = []
            for i in range(24):
                appends.append(asyncio.create_task(b.append(f"m{i}".encode(), vchannels)))
                if i == 12:
                    cluster.kill_node(victim)
                await asyncio.sleep(0.01)
            assert not all(a.done() for a in appends)
            await cluster.start_node(victim)
            results = await asyncio.wait_for(asyncio.gather(*appends), 60)
        copies = await broadcast_copies(cluster.coord_address, channels)
        by_id = {}
        for entries in copies.values():
            for vchannel, bid, offset in entries:
                by_id.setdefault(bid, []).append((vchannel, offset))
        assert len(results) == 24 and sorted(by_id) == sorted(r.broadcast_id for r in results)
        for r in results:
            assert sorted(by_id[r.broadcast_id]) == sorted(
                (v, a.offset) for v, a in r.results.items()
            )
    finally:
        await cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ["persist-pending", "append"])
async def test_coord_killed_mid_broadcast_finishes_it_once_after_restart(spread, crash_at):
    cluster, channels = spread
    vchannels = [f"{p}_v1" for p in channels]
    cluster.kill_coord()
    await cluster.start_coord(env={"STREAMWAL_BROADCAST_CRASH_AT": crash_at})
    async with BroadcastClient(cluster.coord_address) as b:
        append = asyncio.create_task(b.append(b"ddl", vchannels, [KEY]))
        await wait_for(lambda: cluster.coord_proc.poll() is not None, 20, what="coord crash")
        assert not append.done()  # the client retries the same request while the coord is down
        await cluster.start_coord()
        result = await asyncio.wait_for(append, 60)
        assert cluster.coord_events("crash injected")
        assert_exactly_once(await broadcast_copies(cluster.coord_address, channels), result)
        # The resumed task still holds its key until acked everywhere.
        with pytest.raises(ResourceKeyConflict):
            await b.append(b"again", vchannels[:1], [KEY])


async def test_conflicting_key_rejected_until_holder_acked_everywhere_shared_coexist(spread):
    cluster, channels = spread
    v0, v1 = f"{channels[0]}_v1", f"{channels[1]}_v1"
    async with BroadcastClient(cluster.coord_address) as b:
        first = await b.append(b"create c1", [v0, v1], [KEY])
        with pytest.raises(ResourceKeyConflict) as err:
            await b.append(b"drop c1", [v0], [KEY])
        assert "collection:c1" in str(err.value)
        assert f"broadcast {first.broadcast_id}" in str(err.value)

        with pytest.raises(TimeoutError):
            await b.block_until_resource_key_ack_once(KEY, timeout=0.5)
        waiter = asyncio.create_task(b.block_until_resource_key_ack_all(KEY, timeout=20))
        await b.ack(first.broadcast_id, v0)
        await b.block_until_resource_key_ack_once(KEY, timeout=5)
        await b.ack(first.broadcast_id, v0)  # idempotent
        with pytest.raises(ResourceKeyConflict):  # acked once is not acked everywhere
            await b.append(b"drop c1", [v0], [KEY])
        assert not waiter.done()
        await b.ack(first.broadcast_id, v1)
        await asyncio.wait_for(waiter, 5)
        second = await b.append(b"drop c1", [v0], [KEY])  # released: accepted now
        assert second.broadcast_id > first.broadcast_id
        tombstones = 'streamwal_coord_broadcast_tasks{state="tombstone"}'
        assert await coord_metric(cluster, tombstones) == 1

        # Shared keys coexist; an exclusive one conflicts with a shared holder.
        db = ResourceKey("database", "d1", shared=True)
        s1 = await b.append(b"s1", [v0], [db])
        await b.append(b"s2", [v1], [db])
        with pytest.raises(ResourceKeyConflict, match=f"broadcast {s1.broadcast_id}"):
            await b.append(b"x", [v0], [ResourceKey("database", "d1")])
        # No holder: the waits return at once.
        await b.block_until_resource_key_ack_all(ResourceKey("nobody", "n"), timeout=5)


async def test_bad_acks_and_targets_get_typed_errors_sync_client(spread):
    cluster, channels = spread
    v0 = f"{channels[0]}_v1"
    with SyncBroadcastClient(cluster.coord_address) as b:
        result = b.append(b"ddl", [v0], properties={"k": "v"})
        assert result.results[v0].offset >= 0
        with pytest.raises(BroadcastNotFound, match="no broadcast 999999"):
            b.ack(999999, v0)
        with pytest.raises(InvalidArgument, match="not a target"):
            b.ack(result.broadcast_id, f"{channels[1]}_v1")
        with pytest.raises(ChannelNotExist, match="nope_v1"):
            b.append(b"ddl", ["nope_v1"])
        with pytest.raises(InvalidArgument, match="reserved"):
            b.append(b"ddl", [v0], properties={"_bid": "1"})
        with pytest.raises(InvalidArgument, match="at least one"):
            b.append(b"ddl", [])
        b.ack(result.broadcast_id, v0)
