"""The reassignment protocol as pure transitions: terms grow, histories fence, replay resumes."""

from __future__ import annotations

import pytest

from streamwal.coord import state_machine as sm
from streamwal.proto import streaming_pb2 as pb

A = sm.NodeRef(1, "127.0.0.1:1001")
B = sm.NodeRef(2, "127.0.0.1:1002")
C = sm.NodeRef(3, "127.0.0.1:1003")


def run(meta: pb.PChannelMeta) -> tuple[pb.PChannelMeta, list[sm.Action]]:
    """Execute every action `next_actions` asks for, as a driver would (without I/O)."""
    actions = sm.next_actions(meta)
    for action in actions:
        if isinstance(action, sm.PersistAssigned):
            meta = action.meta
    return meta, actions


def test_new_channel_is_uninitialized_at_term_zero():
    meta = sm.new_channel("ch_0")
    assert meta.state == sm.UNINITIALIZED
    assert meta.channel.term == 0
    assert sm.owner(meta) is None
    assert sm.next_actions(meta) == []


def test_first_assignment_steps_and_no_history():
    meta = sm.begin_assignment(sm.new_channel("ch_0"), A)
    assert (meta.state, meta.channel.term, meta.node.server_id) == (sm.ASSIGNING, 1, 1)
    assert list(meta.histories) == []
    meta, actions = run(meta)
    assert [a.step for a in actions] == [sm.Step.ASSIGN, sm.Step.PERSIST_ASSIGNED]
    assert actions[0] == sm.AssignNew(A, "ch_0", 1)
    assert (meta.state, meta.channel.term) == (sm.ASSIGNED, 1)


def test_reassignment_pushes_old_owner_then_removes_it_before_assigning():
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    moving = sm.begin_assignment(meta, B)
    assert moving.channel.term == 2
    assert [(h.term, h.node.server_id) for h in moving.histories] == [(1, 1)]
    done, actions = run(moving)
    assert actions == [
        sm.RemoveOld(A, "ch_0", 1),
        sm.AssignNew(B, "ch_0", 2),
        sm.PersistAssigned(done),
    ]
    assert done.state == sm.ASSIGNED and list(done.histories) == []
    assert done.node.server_id == 2


def test_crash_in_assigning_replays_the_same_steps():
    """The persisted ASSIGNING meta alone says what is left: replay is identical."""
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    moving = sm.begin_assignment(meta, B)
    restored = pb.PChannelMeta.FromString(moving.SerializeToString())
    assert sm.next_actions(restored) == sm.next_actions(moving)


def test_retarget_while_assigning_keeps_every_possible_holder_in_histories():
    """Assign to B may have reached B before it failed: B must be fenced too."""
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    to_b = sm.begin_assignment(meta, B)
    to_c = sm.begin_assignment(to_b, C)
    assert to_c.channel.term == 3
    assert [(h.term, h.node.server_id) for h in to_c.histories] == [(1, 1), (2, 2)]
    _, actions = run(to_c)
    assert [type(a) for a in actions] == [
        sm.RemoveOld,
        sm.RemoveOld,
        sm.AssignNew,
        sm.PersistAssigned,
    ]


def test_moving_back_to_a_history_node_skips_removing_it():
    """Remove(A, 1) after Assign(A, 3) would be wrong; the higher Assign fences term 1."""
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    back = sm.begin_assignment(sm.begin_assignment(meta, B), A)
    _, actions = run(back)
    assert actions[0] == sm.RemoveOld(B, "ch_0", 2)
    assert actions[1] == sm.AssignNew(A, "ch_0", 3)


def test_terms_only_grow_over_any_sequence():
    meta = sm.new_channel("ch_0")
    seen = [meta.channel.term]
    for target in [A, B, B, C, A, C]:
        meta = sm.begin_assignment(meta, target)
        seen.append(meta.channel.term)
        meta, _ = run(meta)
        seen.append(meta.channel.term)
        meta = sm.mark_unavailable(meta)
        seen.append(meta.channel.term)
    assert seen == sorted(seen) and seen[-1] == 6


def test_unavailable_keeps_lost_node_for_fencing():
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    lost = sm.mark_unavailable(meta)
    assert (lost.state, lost.channel.term, lost.node.server_id) == (sm.UNAVAILABLE, 1, 1)
    assert sm.next_actions(lost) == []
    again = sm.begin_assignment(lost, B)
    assert [(h.term, h.node.server_id) for h in again.histories] == [(1, 1)]


def test_invalid_transitions_are_refused():
    with pytest.raises(sm.InvalidTransition):
        sm.finish_assignment(sm.new_channel("x"))
    with pytest.raises(sm.InvalidTransition):
        sm.mark_unavailable(sm.new_channel("x"))


def test_needs_assignment():
    meta, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    assert sm.needs_assignment(sm.new_channel("x"), alive={1})
    assert not sm.needs_assignment(meta, alive={1, 2})
    assert sm.needs_assignment(meta, alive={2})
    assert sm.needs_assignment(sm.mark_unavailable(meta), alive={1})


def test_stale_and_missing_channels():
    ch0, _ = run(sm.begin_assignment(sm.new_channel("ch_0"), A))
    ch1, _ = run(sm.begin_assignment(sm.begin_assignment(sm.new_channel("ch_1"), A), B))
    metas = {"ch_0": ch0, "ch_1": ch1}
    served = [
        pb.PChannelInfo(name="ch_0", term=1),  # correct
        pb.PChannelInfo(name="ch_1", term=1),  # moved to B at term 2: stale
        pb.PChannelInfo(name="gone", term=4),  # unknown: stale
    ]
    stale = sm.stale_channels(1, served, metas)
    assert [(i.name, i.term) for i in stale] == [("ch_1", 1), ("gone", 4)]
    assert sm.missing_channels(2, [], metas) == ["ch_1"]
    assert sm.missing_channels(2, [pb.PChannelInfo(name="ch_1", term=2)], metas) == []
    assert sm.missing_channels(1, served, metas) == []
