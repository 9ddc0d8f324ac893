"""Replica placement, replacement and the per-round step of a replicated pchannel."""

from __future__ import annotations

from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.coord.replica_set import (
    ChannelView,
    Rejoin,
    TermChange,
    Wait,
    desired_members,
    joint_complete,
    next_step,
    place,
    readmit,
    replica_loads,
)
from streamwal.proto import coord_pb2 as cpb


def view(**kw) -> ChannelView:
    base = dict(
        assigned=True,
        placed=True,
        leader=1,
        members=(1, 2, 3),
        previous=(),
        wanted=3,
        missing=frozenset(),
    )
    base.update(kw)
    return ChannelView(**base)


ALL = {1, 2, 3, 4}


def test_place_on_distinct_least_loaded_nodes() -> None:
    loads = replica_loads({"a": [1, 2, 3], "b": [1, 2, 4]}, [1, 2, 3, 4, 5])
    assert loads == {1: 2, 2: 2, 3: 1, 4: 1, 5: 0}
    assert place(3, loads, [1, 2, 3, 4, 5], []) == [5, 3, 4]
    assert place(3, loads, [1, 2, 3, 4, 5], [5]) == [3, 4, 1]
    assert place(2, loads, [1, 2], [], exclude=[1]) == [2]


def test_balance_holds_over_many_channels() -> None:
    sets: dict[str, list[int]] = {}
    for i in range(12):
        sets[f"c{i}"] = place(3, replica_loads(sets, range(1, 6)), range(1, 6), [])
        assert len(set(sets[f"c{i}"])) == 3
    counts = replica_loads(sets, range(1, 6)).values()
    assert max(counts) - min(counts) <= 1


def test_lost_member_replaced_in_place_by_a_live_non_member() -> None:
    loads = {1: 1, 2: 1, 3: 1, 4: 0, 5: 3}
    got = desired_members(
        [1, 2, 3], 3, alive={1, 3, 4, 5}, live={1, 3, 4, 5}, drained=[], loads=loads
    )
    assert got == [1, 4, 3]
    # no spare node: the lost member stays (it may come back)
    assert desired_members([1, 2, 3], 3, {1, 3}, {1, 3}, [], loads) == [1, 2, 3]
    # drained member moves off when it can; fills up to the wanted count
    assert desired_members([1, 2], 3, ALL, ALL, [2], loads) == [1, 4, 3]


def test_new_channel_waits_for_a_majority_of_nodes() -> None:
    step = next_step(view(placed=False, members=(), leader=None), {1}, {1}, [], {})
    assert isinstance(step, Wait)
    step = next_step(view(placed=False, members=(), leader=None), {1, 2}, {1, 2}, [], {})
    assert step == TermChange("placement", (1, 2))


def test_lost_leader_fails_over_and_is_replaced_when_a_spare_exists() -> None:
    alive = {2, 3}
    assert next_step(view(), alive, alive, [], {}) == TermChange("failover", (1, 2, 3))
    alive = {2, 3, 4}
    assert next_step(view(), alive, alive, [], {}) == TermChange("failover", (4, 2, 3))


def test_restarted_leader_not_serving_fails_over_but_followers_rejoin() -> None:
    assert next_step(view(missing=frozenset({1})), ALL, ALL, [], {}) == TermChange(
        "failover", (1, 2, 3)
    )
    assert next_step(view(missing=frozenset({3})), ALL, ALL, [], {}) == Rejoin((3,))
    # a suspect (alive, not live) follower is not assigned yet
    assert next_step(view(missing=frozenset({3})), ALL, ALL - {3}, [], {}) is None


def test_no_majority_alive_waits() -> None:
    assert isinstance(next_step(view(), {1}, {1}, [], {}), Wait)


def test_lost_follower_reconfigures_but_not_during_a_pending_change() -> None:
    alive = {1, 2, 4}
    assert next_step(view(), alive, alive, [], {}) == TermChange("reconfigure", (1, 2, 4))
    pending = view(members=(1, 2, 4), previous=(1, 2, 3))
    assert next_step(pending, {1, 2, 4, 5}, {1, 2, 4, 5}, [], {}) is None
    # the joint quorum needs a majority of the previous set alive too
    assert isinstance(next_step(pending, {1, 4}, {1, 4}, [], {}), Wait)


def test_half_done_assignment_resumes_with_a_term_change() -> None:
    assert next_step(view(assigned=False), ALL, ALL, [], {}) == TermChange("resume", (1, 2, 3))


def test_joint_complete_when_every_member_acked_the_change_point() -> None:
    assert not joint_complete([1, 2, 4], 1, 100, {2: 100, 4: 99})
    assert joint_complete([1, 2, 4], 1, 100, {2: 120, 4: 100})
    assert not joint_complete([1, 2, 4], 1, 100, {2: 120})


def test_a_drained_leader_is_kept_until_it_hands_over_to_a_caught_up_follower() -> None:
    # a spare exists, but the alive drained leader is not replaced in place
    assert desired_members([1, 2, 3], 3, ALL, ALL, [1], {}, leader=1) == [1, 2, 3]
    assert next_step(view(), ALL, ALL, [1], {}) is None  # nobody caught up yet
    step = next_step(view(caught_up=frozenset({3})), ALL, ALL, [1], {})
    assert step == TermChange("handover", (1, 2, 3))
    # once it follows, the drained node is replaced by the spare
    assert next_step(view(leader=3), ALL, ALL, [1], {}) == TermChange("reconfigure", (4, 2, 3))


def test_readmit_puts_a_replaced_voter_back_in_place_of_a_member_being_added() -> None:
    assert readmit((4, 2, 3), 1, stable=(1, 2, 3)) == (1, 2, 3)
    assert readmit((4, 5, 3), 1, stable=(1, 2, 3)) == (4, 1, 3)  # the last one added
    assert readmit((1, 2, 3), 1, stable=(1, 2, 3)) == (1, 2, 3)  # already a member
    assert readmit((1, 2, 3), 4, stable=(1, 2, 3)) is None  # nobody is being added


def test_a_shrink_removes_followers_gone_ones_first_never_the_leader() -> None:
    loads = {n: 0 for n in (1, 2, 3, 4, 5)}
    live = alive = {1, 2, 3, 4, 5}
    assert rs.desired_members((1, 2, 3), 1, alive, live, (), loads, leader=2) == [2]
    # node 3 is gone: it goes first; then the last added of the others
    assert rs.desired_members((1, 2, 3, 4, 5), 3, alive - {3}, live - {3}, (), loads, 1) == [
        1,
        2,
        4,
    ]
    view = rs.ChannelView(True, True, 1, (1, 2, 3), (), 1, frozenset())
    assert rs.next_step(view, alive, live, (), loads) == rs.TermChange("reconfigure", (1,))


def test_a_single_owner_is_the_set_a_growth_starts_from() -> None:
    record = cpb.ChannelRecord(replicas=3)
    record.meta.CopyFrom(
        sm.finish_assignment(sm.begin_assignment(sm.new_channel("c"), sm.NodeRef(4, "h:4")))
    )
    assert rs.current_members(record) == (4,)
    view = rs.ChannelView(True, True, 4, (4,), (), 3, frozenset())
    loads = {n: 0 for n in (1, 2, 3, 4)}
    step = rs.next_step(view, {1, 2, 3, 4}, {1, 2, 3, 4}, (), loads)
    assert step == rs.TermChange("reconfigure", (4, 1, 2))  # the owner stays, and votes
    assert rs.next_step(view, {1, 2, 3}, {1, 2, 3}, (), loads) == rs.Wait(
        "no majority of its replicas is alive"
    )


def test_leader_down_fails_over_at_once_only_when_clean() -> None:
    """A dead leader's node (both ports refuse) need not wait the grace when a majority of
    the set is up without it (the term change fences it and is clean); otherwise it waits."""
    cases = [
        # (view overrides, alive, down, expected)
        ({}, {1, 2, 3}, {1}, True),
        ({}, {1, 2, 3}, set(), False),  # nobody known dead
        ({}, {1, 2, 3}, {2}, False),  # a follower down: no failover
        ({}, {1, 2, 3}, {1, 2}, False),  # no majority up without the leader: the grace
        ({}, {1, 3}, {1}, False),  # node 2 lost: 3 alone is no majority
        ({"assigned": False}, {1, 2, 3}, {1}, False),  # a change under way: its own path
        ({"previous": (1, 4)}, {1, 2, 3, 4}, {1}, True),  # joint: 4 holds the previous set
        ({"previous": (1, 4)}, {1, 2, 3}, {1}, False),  # joint set without a majority
    ]
    for overrides, alive, down, expected in cases:
        assert rs.leader_down(view(**overrides), alive, down) is expected, (overrides, down)
    # A down leader counts as missing: a failover that keeps the node as a member.
    v = view()
    if rs.leader_down(v, ALL, {1}):
        v = view(missing=frozenset({1}))
    assert next_step(v, ALL, ALL - {1}, set(), dict.fromkeys(ALL, 0)) == TermChange(
        "failover", (1, 2, 3)
    )
