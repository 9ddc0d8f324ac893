"""Broadcast on Kubernetes: tasks kept as ConfigMaps by the operator's meta store.

What users rely on: a broadcast sent to the operator's coord lands on every target
vchannel exactly once; a task recorded when the operator dies is resumed by the next
operator (its resource key still held), and ids keep counting up across the restart.
The store itself is checked against the real API server: guarded writes, listing, deletion.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import config

from streamwal.client.broadcast import BroadcastClient
from streamwal.coord import broadcast_task as bt
from streamwal.coord.meta_store import VersionConflict
from streamwal.errors import OnShutdown, ResourceKeyConflict
from streamwal.message import ResourceKey
from streamwal.operator.kube_meta_store import BROADCAST_LABEL, KubeMetaStore
from streamwal.proto import broadcast_pb2 as bpb
from tests.accessor.test_broadcast import assert_exactly_once, broadcast_copies
from tests.operator.conftest import Cluster, pchannel_yaml, wait_for

KEY = ResourceKey("collection", "c1")


async def test_the_store_keeps_tasks_as_guarded_configmaps(kubeconfig, kube_ns) -> None:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    store = KubeMetaStore(api, kube_ns)
    try:
        task = bpb.BroadcastTask(broadcast_id=7, request_id="r", state=bt.PENDING)
        first = await store.put_broadcast(task, None)
        with pytest.raises(VersionConflict):  # it exists already
            await store.put_broadcast(task, None)
        task.state = bt.DONE
        second = await store.put_broadcast(task, first.version)
        with pytest.raises(VersionConflict):  # another replica wrote since `first`
            await store.put_broadcast(task, first.version)
        other = bpb.BroadcastTask(broadcast_id=3, request_id="q", state=bt.PENDING)
        await store.put_broadcast(other, None)
        listed = await store.list_broadcasts()
        assert [(s.task.broadcast_id, s.task.state) for s in listed] == [
            (3, bt.PENDING),
            (7, bt.DONE),
        ]
        assert listed[1].version == second.version
        cms = store.core.list_namespaced_config_map(
            kube_ns, label_selector=f"{BROADCAST_LABEL}=true"
        )
        assert sorted(cm.metadata.name for cm in cms.items) == [
            "streamwal-broadcast-3",
            "streamwal-broadcast-7",
        ]
        await store.delete_broadcast(7)
        await store.delete_broadcast(7)  # gone already: no error
        assert [s.task.broadcast_id for s in await store.list_broadcasts()] == [3]
    finally:
        api.close()


def broadcast_tasks(cluster: Cluster) -> dict[int, bpb.BroadcastTask]:
    store = KubeMetaStore(cluster.api, cluster.ns)
    return {s.task.broadcast_id: s.task for s in asyncio.run(store.list_broadcasts())}


async def test_broadcast_through_the_operator_lands_and_survives_its_restart(
    cluster: Cluster, monkeypatch
) -> None:
    cluster.add_node(1)
    cluster.add_node(2)
    channels = ["ch-a", "ch-b"]
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml(*channels))
    vchannels = [f"{p}_v1" for p in channels]

    # The first operator dies right after it recorded the task, before any copy went out.
    monkeypatch.setenv("STREAMWAL_BROADCAST_CRASH_AT", "persist-pending")
    op = cluster.start_operator()
    monkeypatch.delenv("STREAMWAL_BROADCAST_CRASH_AT")
    for name in channels:
        await asyncio.to_thread(wait_for, lambda n=name: cluster.ready(n), 30, f"{name} Ready")
    async with BroadcastClient(f"127.0.0.1:{op.coord_port}") as b:
        append = asyncio.create_task(b.append(b"ddl", vchannels, [KEY]))
        await asyncio.to_thread(wait_for, lambda: op.proc.poll() is not None, 20, "crash")
        append.cancel()
    assert [t.state for t in (await asyncio.to_thread(broadcast_tasks, cluster)).values()] == [
        bt.PENDING
    ]

    # The next operator lists the ConfigMaps, resumes the task and holds its key again.
    # (Alone: the crashed one's Lease would make it wait out the lease duration first.)
    op = cluster.start_operator(lease=None)
    coord = f"127.0.0.1:{op.coord_port}"

    def appended() -> bpb.BroadcastTask | None:
        tasks = broadcast_tasks(cluster)
        return tasks[1] if tasks.get(1) and tasks[1].state == bt.DONE else None

    resumed = await asyncio.to_thread(wait_for, appended, 30, "the resumed task DONE")
    copies = await broadcast_copies(coord, channels)
    assert sorted(v for entries in copies.values() for v, bid, _ in entries if bid == 1) == (
        vchannels
    )
    assert {v.vchannel for v in resumed.vchannels if v.appended} == set(vchannels)
    async with BroadcastClient(coord) as b:
        with pytest.raises(ResourceKeyConflict, match="broadcast 1"):
            await b.append(b"drop c1", vchannels[:1], [KEY])
        for v in vchannels:
            await b.ack(1, v)
        # A fresh broadcast through the restarted operator: a new id, exactly once.
        result = await b.append(b"drop c1", vchannels, [KEY])
        assert result.broadcast_id == 2
        copies = await broadcast_copies(coord, channels)
        assert_exactly_once({p: [e for e in c if e[1] == 2] for p, c in copies.items()}, result)
    tasks = await asyncio.to_thread(broadcast_tasks, cluster)
    assert tasks[1].state == bt.TOMBSTONE and tasks[2].state == bt.DONE


async def test_an_operator_that_is_not_active_refuses_broadcasts(cluster: Cluster) -> None:
    leader = cluster.start_operator()
    await asyncio.to_thread(wait_for, lambda: '"leading"' in leader.text(), 20, "a leader")
    op = cluster.start_operator()  # the Lease is held: a standby
    async with BroadcastClient(f"127.0.0.1:{op.coord_port}") as b:
        with pytest.raises(OnShutdown, match="not the active one"):
            await asyncio.wait_for(b.append(b"ddl", ["ch-a_v1"]), 10)
