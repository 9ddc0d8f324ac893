"""The coord's sagas driven by tables of outcomes: the steps a reassignment and a replicated
term change take, what they persist, and how a crash after any step is recovered by the
next round (coord/sagas.py with coord/planner.py; no node, no store, no process)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from streamwal.coord import planner as pl
from streamwal.coord import sagas
from streamwal.coord import state_machine as sm
from streamwal.coord.leader_choice import FenceReport
from streamwal.coord.memory import Memory
from streamwal.coord.meta_store import Stored
from streamwal.errors import DataLoss, Inner
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb
from tests.coord.test_planner import NODES, ref, replicated, single


def ctx(alive=(1, 2, 3, 4), live=None, lost=(), drained=()) -> sagas.Round:
    return sagas.Round(
        nodes=NODES,
        alive=frozenset(alive),
        live=frozenset(alive if live is None else live),
        lost=frozenset(lost),
        drained=frozenset(drained),
    )


def fence_all(end: dict[int, tuple[int, int]]) -> Callable:
    """Outcomes: every Fence answered with (last term, log end) per node in `end`."""

    def outcome(step):
        if isinstance(step, sagas.Fence):
            return [
                FenceReport(n.server_id, *end[n.server_id])
                for n in step.nodes
                if n.server_id in end
            ]
        if isinstance(step, sagas.AssignFollowers):
            return [True] * len(step.assigns)
        return None

    return outcome


NO_ANSWERS = fence_all({})


def drive(saga: sagas.Saga, outcome: Callable = NO_ANSWERS, stop_after: int | None = None):
    """Every step the saga takes with the given outcomes, and its result; with
    `stop_after`, only that many steps that change something run ("crashed" after)."""
    steps, done = [], 0
    sent = None
    while True:
        try:
            step = saga.send(sent)
        except StopIteration as end:
            return steps, end.value
        steps.append(step)
        if not isinstance(step, sagas.Announce):
            done += 1
            if stop_after is not None and done > stop_after:
                return steps[:-1], "crashed"
        sent = outcome(step)


def names(steps) -> list[str]:
    return [s.message if isinstance(s, sagas.Announce) else s.step.value for s in steps]


def persisted(steps) -> cpb.ChannelRecord:
    return [s for s in steps if isinstance(s, sagas.Persist)][-1].record


# ----------------------------------------------------------------- single replica


def test_a_move_persists_then_removes_the_old_owner_then_assigns_with_catch_up() -> None:
    before = single("a", node=1, term=3).record
    steps, result = drive(sagas.reassignment(before, ref(2), "rebalance", ref(1), 40, ctx()))
    assert names(steps) == ["persist-assigning", "remove", "assign", "persist-assigned"]
    assert persisted(steps[:1]).meta.state == sm.ASSIGNING
    assert steps[1] == sagas.Remove(ref(1), "a", 3, 1.0)
    assert (steps[2].node, steps[2].term, steps[2].catch_up_from) == (ref(2), 4, NODES[1])
    final = persisted(steps).meta
    assert (final.state, final.channel.term, final.node.server_id) == (sm.ASSIGNED, 4, 2)
    assert isinstance(result, sagas.Assigned) and result.fields["old_node"] == 1


def test_a_failed_assign_announces_and_names_the_target_and_persists_nothing_more() -> None:
    before = single("a", node=1).record

    def refuse(step):
        return Inner("disk full") if isinstance(step, sagas.Assign) else None

    steps, result = drive(sagas.reassignment(before, ref(2), "failover", ref(1), 0, ctx()), refuse)
    assert names(steps) == ["persist-assigning", "remove", "assign", "assign failed"]
    assert steps[-1].notify == "assign-failed" and result == sagas.Failed(2)


def test_a_move_off_a_lost_node_is_unclean_and_skips_offsets_seen() -> None:
    before = single("a", node=1, term=2).record
    saga = sagas.reassignment(before, ref(3), "failover", ref(1), 77, ctx(alive=(2, 3), lost=(1,)))
    steps, result = drive(saga)
    assert names(steps) == [
        "persist-assigning", "remove", "assign", "unclean failover", "persist-assigned",
    ]  # fmt: skip
    assert steps[1].timeout == 0.3  # a lost node gets a short wait
    assert (steps[2].catch_up_from, steps[2].min_next_offset) == ("", 77)
    assert steps[3].level == logging.WARNING and steps[3].notify == "unclean-failover"
    assert result.fields["unclean"] is True


def test_resuming_a_persisted_move_replays_only_what_is_left() -> None:
    moving = single("a", node=1, term=1).record
    moving.meta.CopyFrom(sm.begin_assignment(moving.meta, ref(2)))
    steps, result = drive(sagas.reassignment(moving, None, "resume", ref(1), 0, ctx()))
    assert names(steps) == ["remove", "assign", "persist-assigned"]
    assert isinstance(result, sagas.Assigned) and result.reason == "resume"
    assert persisted(steps).meta.channel.term == 2


# ----------------------------------------------------------------- replicated


def test_a_term_change_fences_chooses_the_longest_log_and_assigns_every_live_member() -> None:
    before = replicated("r", term=4).record
    end = {1: (4, 10), 2: (4, 12), 3: (4, 11), 4: (0, 0)}
    round_ = ctx(alive=(2, 3, 4), lost=(1,))
    steps, result = drive(sagas.term_change(before, (4, 2, 3), "failover", round_), fence_all(end))
    assert names(steps) == [
        "persist-assigning", "fence", "assign", "assign-followers", "persist-assigned",
    ]  # fmt: skip
    first = persisted(steps[:1])
    assert first.meta.channel.term == 5 and first.meta.state == sm.ASSIGNING
    assert [m.server_id for m in first.members] == [4, 2, 3]
    assert [m.server_id for m in first.previous_members] == [1, 2, 3]  # joint quorum
    assert [n.server_id for n in steps[1].nodes] == [2, 3, 4]  # alive voters and new members
    assert steps[2].node == ref(2) and steps[2].replica_set.role == pb.REPLICA_ROLE_LEADER
    assert sorted(a.node.server_id for a in steps[3].assigns) == [3, 4]
    final = persisted(steps)
    assert (final.meta.state, final.meta.node.server_id, final.joint_until) == (sm.ASSIGNED, 2, 12)
    assert result.fields["new_node"] == 2 and round_.leaders == {2: 1, 1: 0}


def test_no_majority_of_answers_means_no_leader_and_nothing_persisted_after() -> None:
    before = replicated("r", term=4).record
    steps, result = drive(
        sagas.term_change(before, (1, 2, 3), "failover", ctx()), fence_all({1: (4, 3)})
    )
    # Only node 1 answered: the other Fences failed (the outcome lists answers only).
    assert names(steps) == ["persist-assigning", "fence", "persist-assigning", "no leader chosen"]
    assert steps[-1].notify == "assign-failed" and result == sagas.Failed()
    assert persisted(steps).unled_term == persisted(steps).meta.channel.term == 5


def test_failed_elections_do_not_inflate_the_term_and_the_next_one_converges() -> None:
    """sc_226 of issue 24: attempts that fence too few replicas chose no leader, and every
    one raised the term (2 -> 80). Now each retry fences again under the same term, and the
    first attempt that hears a majority leads under it: one term per failover."""
    record = replicated("r", term=4).record
    round_ = ctx(alive=(2, 3), lost=(1,))
    for _ in range(5):  # node 3's answers keep timing out: only node 2 answers
        steps, result = drive(
            sagas.term_change(record, (2, 3, 4), "failover", round_), fence_all({2: (4, 9)})
        )
        assert result == sagas.Failed()
        record = persisted(steps)
        assert record.meta.channel.term == 5 and record.unled_term == 5
    snapshot = pl.Snapshot({"r": Stored(record, "v9")}, NODES, frozenset(), Memory())
    seen = pl.Observations(frozenset({2, 3, 4}), frozenset({2, 3, 4}), frozenset({1}))
    (job,) = pl.plan(snapshot, seen, 0.0).assign
    steps, done = drive(
        sagas.term_change(record, job.members, job.reason, ctx(alive=(2, 3, 4), lost=(1,))),
        fence_all({2: (4, 9), 3: (4, 12), 4: (0, 0)}),
    )
    final = persisted(steps)
    assert isinstance(done, sagas.Assigned) and done.fields["new_node"] == 3
    assert (final.meta.state, final.meta.channel.term, final.unled_term) == (sm.ASSIGNED, 5, 0)
    assert persisted(steps[:1]).unled_term == 0  # cleared before anything is assigned


def test_a_term_whose_leader_may_have_been_told_is_never_reused() -> None:
    """An attempt that failed after its Assign went out (or crashed anywhere after the
    first persist) leaves unled_term 0: the next one takes a higher term."""
    before = replicated("r", term=4).record
    end = {1: (4, 10), 2: (4, 10), 3: (4, 10)}

    def assign_fails(step):
        return Inner("no") if isinstance(step, sagas.Assign) else fence_all(end)(step)

    steps, result = drive(sagas.term_change(before, (1, 2, 3), "failover", ctx()), assign_fails)
    record = persisted(steps)
    assert result == sagas.Failed() and record.unled_term == 0
    steps, _ = drive(sagas.term_change(record, (1, 2, 3), "resume", ctx()), fence_all(end))
    assert persisted(steps).meta.channel.term == 6


def test_the_handover_won_by_the_drained_leader_is_kept_with_a_backoff() -> None:
    before = replicated("r", term=4).record
    end = {1: (4, 12), 2: (4, 11), 3: (4, 11)}
    steps, result = drive(
        sagas.term_change(before, (1, 2, 3), "handover", ctx(drained=(1,))), fence_all(end)
    )
    assert steps[2].node == ref(1)  # the longest log wins over the preference
    assert result.fields["new_node"] == 1 and result.handover_kept


@pytest.mark.parametrize("crash_after", range(len(sagas.TERM_CHANGE_STEPS)))
def test_a_term_change_crashed_after_any_step_is_finished_by_the_next_round(crash_after) -> None:
    """The record persisted before the crash is all the next coord has: its round plans a
    term change again (under a higher term) unless the change was already persisted."""
    before = replicated("r", term=4)
    end = {1: (4, 10), 2: (4, 10), 3: (4, 10), 4: (0, 0)}
    crashed, result = drive(
        sagas.term_change(before.record, (1, 2, 3), "handover", ctx(drained=(1,))),
        fence_all(end),
        stop_after=crash_after + 1,
    )
    assert result == "crashed" or crash_after == len(sagas.TERM_CHANGE_STEPS) - 1
    record = persisted(crashed)
    assert names(crashed)[-1] == sagas.TERM_CHANGE_STEPS[crash_after].value
    snapshot = pl.Snapshot({"r": Stored(record, "v2")}, NODES, frozenset({1}), Memory())
    seen = pl.Observations(frozenset({1, 2, 3}), frozenset({1, 2, 3}))
    plan = pl.plan(snapshot, seen, 0.0)
    if record.meta.state == sm.ASSIGNED:
        assert plan.assign == ()
        return
    (job,) = plan.assign
    assert isinstance(job, pl.ChangeTerm) and job.reason == "resume"
    round_ = ctx(alive=(1, 2, 3), drained=(1,))
    steps, done = drive(sagas.term_change(record, job.members, job.reason, round_), fence_all(end))
    final = persisted(steps).meta
    assert final.state == sm.ASSIGNED and final.channel.term == record.meta.channel.term + 1
    assert final.channel.term > before.record.meta.channel.term + 1
    assert isinstance(done, sagas.Assigned)


def test_rejoin_assigns_returning_members_and_complete_joint_drops_the_previous_set() -> None:
    record = replicated("r", members=(1, 2, 4), previous=(1, 2, 3), term=6).record
    steps, _ = drive(sagas.rejoin(record, (1, 4), ctx()))
    assert names(steps) == ["assign-followers", "followers rejoined"]
    assert [(a.node.server_id, a.term) for a in steps[0].assigns] == [(4, 6)]  # not the leader
    steps, _ = drive(sagas.complete_joint(record))
    assert names(steps) == ["persist-joint-done", "replica set change complete"]
    assert list(persisted(steps).previous_members) == []


def test_unavailable_is_persisted_then_announced() -> None:
    steps, _ = drive(sagas.mark_unavailable(single("a").record, 1, ""))
    assert names(steps) == ["persist-unavailable", "pchannel unavailable: no live node"]
    assert persisted(steps).meta.state == sm.UNAVAILABLE
    assert steps[1].notify_fields == {"node": 1}


def test_a_single_copy_that_lost_acknowledged_records_stops_the_move_until_accepted() -> None:
    before = single("a", node=1, term=2).record

    def lost(step):
        return (
            DataLoss("log ends at 10, acknowledged up to 20")
            if isinstance(step, sagas.Assign)
            else None
        )

    steps, result = drive(sagas.reassignment(before, ref(1), "recheck", ref(1), 0, ctx()), lost)
    assert names(steps) == [
        "persist-assigning", "assign", "persist-unavailable", "pchannel lost acknowledged records",
    ]  # fmt: skip
    assert steps[-1].notify == "data-loss" and persisted(steps).meta.state == sm.UNAVAILABLE
    assert isinstance(result, sagas.Failed) and "acknowledged up to 20" in result.data_loss
    accepting = sagas.reassignment(before, ref(1), "accept-data-loss", ref(1), 0, ctx(), True)
    steps, result = drive(accepting)
    assert steps[1].accept_data_loss and isinstance(result, sagas.Assigned)


def test_the_most_complete_log_on_a_member_being_replaced_stays_and_leads() -> None:
    """Issue 24's endless election: node 1 was lost, the change to (4, 2, 3) began, node 1
    came back holding the most complete log. It leads, in place of node 4 (being added),
    instead of the pchannel raising its term for ever."""
    before = replicated("r", members=(4, 2, 3), previous=(1, 2, 3), term=6, state=sm.ASSIGNING)
    end = {1: (1, 181), 2: (1, 175), 3: (1, 178), 4: (0, 0)}
    steps, result = drive(
        sagas.term_change(before.record, (4, 2, 3), "resume", ctx()), fence_all(end)
    )
    assert "most complete log on a replaced member: it stays and leads" in names(steps)
    final = persisted(steps)
    assert final.meta.node.server_id == 1 and [m.server_id for m in final.members] == [1, 2, 3]
    assert isinstance(result, sagas.Assigned) and result.fields["members"] == [1, 2, 3]


def test_deadlines_grow_with_what_a_round_asks_of_each_node() -> None:
    base = sagas.Timeouts(assign=5.0, remove=1.0, fence=2.0)
    assert base.scaled(1) == base and base.scaled(0) == base
    big = base.scaled(257)  # 1,024 term changes over 4 nodes
    assert (big.fence, big.assign, big.remove) == pytest.approx((4.56, 7.56, 3.56))
    assert (base.follower, big.follower) == pytest.approx((2.0, 4.56))


# ----------------------------------------------------------------- terms never twice


@pytest.mark.parametrize(
    ("record_term", "seen", "unled", "new_term"),
    [
        (4, 0, False, 5),  # nothing reported: term + 1
        (4, 4, False, 5),  # a node at the record's term: term + 1
        (4, 7, False, 8),  # a node at 7: the store lost writes; above what was handed out
        (5, 5, True, 5),  # an unled term nobody holds more of: reused
        (5, 7, True, 8),  # an "unled" term below one a node holds: never reused
    ],
)
def test_a_new_term_is_above_every_term_a_node_reported(
    record_term: int, seen: int, unled: bool, new_term: int
) -> None:
    """The meta store is the coord's memory of terms; if it lost acknowledged writes (a
    damaged journal tail), a node may hold a term above the record's: the next term
    starts above it, for a single copy's move and a replicated term change alike."""
    round_ = sagas.Round(
        nodes=NODES, alive=frozenset({1, 2, 3, 4}), live=frozenset({1, 2, 3, 4}),
        lost=frozenset(), drained=frozenset(), seen_terms={"a": seen, "r": seen},
    )  # fmt: skip
    if not unled:
        moving = single("a", node=1, term=record_term).record
        steps, _ = drive(sagas.reassignment(moving, ref(2), "failover", ref(1), 0, round_))
        assert steps[0].record.meta.channel.term == new_term
    record = replicated("r", term=record_term).record
    if unled:
        record.meta.state = sm.ASSIGNING
        record.unled_term = record_term
    steps, _ = drive(sagas.term_change(record, (1, 2, 3), "failover", round_))
    assert steps[0].record.meta.channel.term == new_term
