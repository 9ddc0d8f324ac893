"""The pure parts of broadcast: task states, the resource-key table, and the task store."""

from __future__ import annotations

import pytest

from streamwal.coord import broadcast_task as bt
from streamwal.coord.meta_store import LocalMetaStore, VersionConflict
from streamwal.coord.resource_keys import ResourceKeyTable, normalize
from streamwal.errors import InvalidArgument, ResourceKeyConflict
from streamwal.ids import decode_offset
from streamwal.message import PROP_BROADCAST_ID, PROP_VCHANNEL, ResourceKey
from streamwal.proto import streaming_pb2 as pb

TARGETS = {"p_0_v1": "p_0", "p_0_v2": "p_0", "p_1_v1": "p_1"}


def task(bid: int = 7, targets=TARGETS, **props) -> object:
    msg = pb.Message(payload=b"ddl", properties=props)
    return bt.new_task(bid, f"req-{bid}", msg, targets, [ResourceKey("coll", "c1")], 1000)


# ------------------------------------------------------------------ task states


def test_new_task_is_pending_with_sorted_targets_grouped_by_pchannel():
    t = task()
    assert bt.state_name(t) == "pending"
    assert [v.vchannel for v in t.vchannels] == ["p_0_v1", "p_0_v2", "p_1_v1"]
    assert bt.pending_pchannels(t) == {"p_0": ["p_0_v1", "p_0_v2"], "p_1": ["p_1_v1"]}
    assert bt.resource_keys(t) == [ResourceKey("coll", "c1")]


def test_copies_carry_the_broadcast_id_and_their_vchannel():
    t = task(a="1")
    copies = bt.copies(t, "p_0")
    assert [v for v, _ in copies] == ["p_0_v1", "p_0_v2"]
    assert copies[1][1] == {"a": "1", PROP_BROADCAST_ID: "7", PROP_VCHANNEL: "p_0_v2"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"targets": {}},
        {"targets": TARGETS, "_bid": "9"},
        {"targets": TARGETS, "_vc": "x"},
    ],
)
def test_bad_tasks_are_refused(kwargs):
    with pytest.raises(InvalidArgument):
        task(**kwargs)
    with pytest.raises(InvalidArgument, match="request_id"):
        bt.new_task(1, "", pb.Message(), TARGETS, [], 0)


def test_appends_per_pchannel_then_acks_lead_to_tombstone():
    t = bt.record_appended(task(), "p_0", 40, 900, 2000)
    assert bt.state_name(t) == "pending"
    assert [(decode_offset(v.message_id.id), v.time_tick) for v in t.vchannels[:2]] == [
        (40, 900),
        (41, 901),
    ]
    assert bt.pending_pchannels(t) == {"p_1": ["p_1_v1"]}
    t = bt.record_appended(t, "p_1", 3, 950, 2000)
    assert bt.state_name(t) == "done" and not bt.acked_once(t) and bt.holds_keys(t)
    t = bt.record_ack(t, "p_1_v1", 3000)
    assert bt.acked_once(t) and bt.state_name(t) == "done"
    assert bt.record_ack(t, "p_1_v1", 3000) is None  # again: nothing to write
    t = bt.record_ack(bt.record_ack(t, "p_0_v1", 3000), "p_0_v2", 4000)
    assert bt.state_name(t) == "tombstone" and t.tombstoned_at_ms == 4000
    assert not bt.holds_keys(t)


def test_acks_before_the_coord_saw_the_append_are_kept():
    t = task(targets={"p_0_v1": "p_0"})
    t = bt.record_ack(t, "p_0_v1", 10)
    assert bt.state_name(t) == "pending"
    assert bt.state_name(bt.record_appended(t, "p_0", 1, 1, 20)) == "tombstone"


def test_ack_of_a_vchannel_that_is_no_target_names_the_targets():
    with pytest.raises(InvalidArgument, match=r"p_9_v1.*not a target.*p_0_v1"):
        bt.record_ack(task(), "p_9_v1", 0)
    with pytest.raises(InvalidArgument):
        bt.record_appended(task(), "p_9", 0, 0, 0)


def _tomb(bid: int, at: int):
    t = task(bid, targets={"p_0_v1": "p_0"})
    return bt.record_ack(bt.record_appended(t, "p_0", 0, 0, at), "p_0_v1", at)


def test_prune_bounds_count_and_age_but_never_the_highest_id():
    tasks = [_tomb(i, at=i * 1000) for i in range(1, 6)] + [task(6)]
    assert bt.prunable(tasks, 6000, keep=2, max_age_ms=10**9) == [1, 2, 3]
    assert bt.prunable(tasks, 6000, keep=100, max_age_ms=3500) == [1, 2]
    only = [_tomb(9, at=0)]
    assert bt.prunable(only, 10**9, keep=0, max_age_ms=0) == []


# ------------------------------------------------------------------ resource keys


def test_exclusive_conflicts_with_everyone_shared_only_with_exclusive():
    table = ResourceKeyTable()
    table.acquire(1, [ResourceKey("coll", "a", shared=True)])
    table.acquire(2, [ResourceKey("coll", "a", shared=True)])  # shared + shared
    with pytest.raises(ResourceKeyConflict, match=r"coll:a .* held by broadcast 1"):
        table.acquire(3, [ResourceKey("coll", "b"), ResourceKey("coll", "a")])
    assert table.holders("coll", "b") == set()  # all or nothing
    table.acquire(3, [ResourceKey("coll", "b")])
    with pytest.raises(ResourceKeyConflict, match="broadcast 3"):
        table.acquire(4, [ResourceKey("coll", "b", shared=True)])
    table.release(1)
    table.release(2)
    table.acquire(4, [ResourceKey("coll", "a")])
    assert table.holders("coll", "a") == {4}
    assert table.held_by(4) == [ResourceKey("coll", "a")]


def test_keys_in_other_domains_do_not_conflict():
    table = ResourceKeyTable()
    table.acquire(1, [ResourceKey("coll", "a")])
    table.acquire(2, [ResourceKey("db", "a")])
    assert table.holders("coll", "a") == {1}


def test_normalize_merges_duplicates_exclusive_wins_and_refuses_empty_names():
    keys = [ResourceKey("d", "k", True), ResourceKey("d", "k"), ResourceKey("a", "z", True)]
    assert normalize(keys) == [ResourceKey("a", "z", True), ResourceKey("d", "k")]
    with pytest.raises(InvalidArgument):
        normalize([ResourceKey("", "k")])


# ------------------------------------------------------------------ store


async def test_local_store_keeps_tasks_across_reopen(tmp_path):
    store = LocalMetaStore(tmp_path)
    first = await store.put_broadcast(task(1), None)
    with pytest.raises(VersionConflict):
        await store.put_broadcast(task(1), None)
    done = bt.record_appended(first.task, "p_0", 5, 5, 1)
    await store.put_broadcast(done, first.version)
    await store.put_broadcast(task(2), None)
    await store.delete_broadcast(2)
    await store.close()

    store = LocalMetaStore(tmp_path)
    listed = await store.list_broadcasts()
    assert [s.task.broadcast_id for s in listed] == [1]
    assert listed[0].task == done
    await store.close()


# ------------------------------------------------------------------ client message shapes


def test_messages_are_taken_as_bytes_protobuf_or_the_accessors_message():
    from streamwal.client.append import Message
    from streamwal.client.broadcast import to_message

    assert to_message(b"x", {"a": "1"}, 5) == pb.Message(
        payload=b"x", properties={"a": "1", "_t": "5"}
    )
    assert to_message(pb.Message(payload=b"y")) == pb.Message(payload=b"y")
    ours = to_message(Message("p_0_v1", b"z", msg_type=101, properties={"k": "v"}))
    assert ours == pb.Message(payload=b"z", properties={"k": "v", "_t": "101"})
