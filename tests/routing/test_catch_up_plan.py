"""The coord's pure catch-up decisions: which node a moved pchannel copies its log from,
and when a move is an unclean failover."""

from __future__ import annotations

import pytest

from streamwal.coord import state_machine as sm
from streamwal.coord.catch_up import CatchUpPlan, data_holder, hold, plan

A, B, C = sm.NodeRef(1, "h:1"), sm.NodeRef(2, "h:2"), sm.NodeRef(3, "h:3")


def _assigned(node: sm.NodeRef, term: int) -> object:
    meta = sm.begin_assignment(sm.new_channel("p_0"), node)
    meta.channel.term = term
    return sm.finish_assignment(meta)


def test_a_move_from_assigned_copies_from_the_owner() -> None:
    before = _assigned(A, 3)
    holder = data_holder(before, None)
    assert holder == A
    assert plan(holder, B, holder_lost=False, last_seen_next=40) == CatchUpPlan("h:1", 40)


def test_a_retarget_keeps_the_original_holder_not_the_failed_target() -> None:
    moving = sm.begin_assignment(_assigned(A, 3), B)  # ASSIGNING on B, histories [(3, A)]
    retarget = sm.begin_assignment(moving, C)  # B failed: histories [(3, A), (4, B)]
    assert data_holder(retarget, A) == A  # remembered
    assert data_holder(retarget, None) == A  # restarted coord: oldest history entry


def test_a_fresh_move_forgets_an_older_remembered_holder() -> None:
    assert data_holder(_assigned(B, 5), A) == B


def test_no_copy_for_new_channels_or_when_the_target_holds_the_log() -> None:
    assert data_holder(sm.new_channel("p_0"), None) is None
    assert plan(None, A, False, 0) == CatchUpPlan("", 0)
    assert plan(A, A, False, 12) == CatchUpPlan("", 12)


def test_a_lost_holder_means_an_unclean_failover_that_never_reuses_seen_offsets() -> None:
    out = plan(A, B, holder_lost=True, last_seen_next=1234)
    assert out == CatchUpPlan("", 1234, unclean=True)


def test_unavailable_keeps_the_lost_owner_as_holder() -> None:
    assert data_holder(sm.mark_unavailable(_assigned(A, 2)), None) == A


HOLDS = {
    # (holder, gone, gone_for, allow_data_loss, grace) -> waits?
    "a new pchannel has no holder: it may go": ((None, True, None, False, 30.0), False),
    "the holder is alive: the move copies from it": ((A, False, None, False, 30.0), False),
    "the holder is gone: the single copy waits, however long": ((A, True, None, False, 30.0), True),
    "gone for an hour, still waits without the opt-in": ((A, True, 3600.0, False, 30.0), True),
    "data loss allowed, gone within the grace: waits": ((A, True, 10.0, True, 30.0), True),
    "data loss allowed, gone past the grace: goes": ((A, True, 31.0, True, 30.0), False),
    "data loss allowed, declared lost (past the grace): goes": ((A, True, None, True, 30.0), False),
}


@pytest.mark.parametrize("case", list(HOLDS))
def test_a_gone_holder_is_waited_for_unless_data_loss_is_allowed(case: str) -> None:
    args, waits = HOLDS[case]
    assert bool(hold(*args)) == waits
