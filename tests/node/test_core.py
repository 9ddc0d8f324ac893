"""The per-pchannel core as tables of inputs and effects: fencing and take windows,
offsets and producer windows, the replicated commit, divergence, damage and the
invariants (node/core.py; no RocksDB, no gRPC, no event loop)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from streamwal.errors import (
    ChannelFenced,
    ChannelNotExist,
    DataLoss,
    IgnoredOperation,
    UnmatchedChannelTerm,
)
from streamwal.node import records
from streamwal.node import replication_rules as rules
from streamwal.node.channel_meta import ChannelMeta, Tail
from streamwal.node.core import (
    Accepted,
    Answer,
    AppendTick,
    CatchUp,
    Drain,
    Entry,
    Fail,
    Following,
    InvariantBroken,
    Leading,
    MarkDurable,
    Notify,
    PChannelCore,
    Peer,
    PersistMeta,
    ReplicaSet,
    Resend,
    StartFollowing,
    StopFollowing,
    Store,
    Truncate,
)
from streamwal.node.fencing import AssignOutcome, check_access

A, B, C = Peer(1, "a:1"), Peer(2, "b:2"), Peer(3, "c:3")
LEAD = ReplicaSet(True, (A, B, C))
FOLLOW_B = ReplicaSet(False, (A, B, C), leader=B)


def core(meta: ChannelMeta | None = None, end: int = 0, last_term: int = 0, **kw) -> PChannelCore:
    known = meta is not None
    tail = Tail(0, end, 0, end * 10, last_term)
    return PChannelCore("ch", 1, meta or ChannelMeta(), tail, known=known, **kw)


def run(steps, outcomes=None):
    """Drive a generator input: each step gets its outcome (default None); returns the
    effects seen and the result."""
    outcomes = outcomes or {}
    seen, sent = [], None
    while True:
        try:
            effect = steps.send(sent)
        except StopIteration as done:
            return seen, done.value
        seen.append(effect)
        answer = outcomes.get(type(effect))
        sent = answer(effect) if callable(answer) else answer


def kinds(effects) -> list[str]:
    return [type(e).__name__ for e in effects]


def assigned(term: int = 1, rs: ReplicaSet | None = None, **kw) -> PChannelCore:
    c = core(**kw)
    run(c.assign(term, rs))
    return c


def write_all(c: PChannelCore, count: int, term: int | None = None, producer=None) -> list:
    got = c.append(term or c.term, count, 1000, producer=producer)
    assert isinstance(got, Accepted)
    return c.written(got.base, count, 10 * count, c.term, producer, ledger=True)


# ----------------------------------------------------------------- fencing and windows


def test_a_first_assign_persists_then_serves_the_term() -> None:
    c = core()
    effects, outcome = run(c.assign(1))
    assert outcome is AssignOutcome.TAKE
    assert kinds(effects) == ["PersistMeta", "Notify"]
    assert effects[0].meta.history == [(1, 0)] and effects[0].meta.serving
    c.access(1)
    with pytest.raises(UnmatchedChannelTerm, match="not assigned here"):
        c.access(2)


def test_while_a_higher_term_is_taken_neither_term_is_served() -> None:
    c = assigned(1)
    c.append(1, 3, 1000)  # in flight: the take waits for it
    steps = c.assign(2)
    assert isinstance(next(steps), Drain)
    with pytest.raises(UnmatchedChannelTerm, match="still taking"):
        c.access(2)
    with pytest.raises(UnmatchedChannelTerm, match="stale"):
        c.access(1)
    c.written(0, 3, 30, 1, None, ledger=True)
    _, outcome = run(steps)
    assert outcome is AssignOutcome.TAKE and c.meta.history == [(1, 0), (2, 3)]
    c.access(2)


def test_a_restarted_node_serves_nothing_until_assigned_again() -> None:
    c = core(ChannelMeta(term=3, serving=True, assigned_term=3, history=[(3, 0)]), end=5)
    with pytest.raises(ChannelNotExist, match="recovering"):
        c.access(3)
    _, outcome = run(c.assign(3))
    assert outcome is AssignOutcome.RESUME
    c.access(3)
    with pytest.raises(IgnoredOperation):
        run(c.assign(2))


def test_fence_raises_the_term_persists_and_fails_the_leaders_waiters() -> None:
    c = assigned(1, LEAD)
    write_all(c, 1)  # the leader's tick
    assert c.wait_commit(1, 5, "w") == []
    effects, report = run(c.fence_term(4))
    assert kinds(effects) == ["Fail", "Notify", "PersistMeta"]
    assert effects[0].tokens == ("w",) and isinstance(effects[0].error, ChannelFenced)
    assert report == (1, 1, 0, "") and effects[-1].meta.term == 4
    with pytest.raises(ChannelFenced, match="fenced at term 4"):
        c.access(1)
    assert run(c.fence_term(2)) == ([], (1, 1, 0, ""))  # lower: only reports


def test_remove_stops_serving_an_older_remove_is_ignored() -> None:
    c = assigned(2)
    with pytest.raises(IgnoredOperation):
        run(c.remove(1))
    effects, _ = run(c.remove(2))
    # Consumers are woken to see the fence move, the meta is persisted once drained.
    assert kinds(effects) == ["Notify", "PersistMeta"] and not effects[1].meta.serving
    with pytest.raises(ChannelFenced, match="removed"):
        c.access(2)


def test_access_answers_as_check_access_on_the_fence_in_every_state() -> None:
    """An append's access check reads the open case off the fields (core.access): in
    every combination of what the fence is made of it must say what check_access says
    of the Fence, the same error with the same words."""
    c = assigned(1)
    base = c.meta
    roles = [None, Leading(2, [A, B, C], 0), Following(2, B, 0)]
    grid = itertools.product(
        [1, 2, 3],  # term asked
        [(2, 2), (2, 1), (3, 2)],  # (meta.term, meta.assigned_term)
        [True, False],  # serving
        [False, True],  # recovering
        [0, 3],  # taking
        [None, 4],  # bad_from
        [0, 5, 20],  # lost_until (the log ends at 10)
        roles,
    )
    checked = 0
    for term, (t, at), serving, recovering, taking, bad, lost, role in grid:
        c.meta = replace(base, term=t, assigned_term=at, serving=serving)
        c.recovering, c.taking, c.bad_from, c.lost_until, c.role = (
            recovering,
            taking,
            bad,
            lost,
            role,
        )
        c.bad_reason = "" if bad is None else "checksum"
        c.committed_next = c.next_offset = 10
        want: Exception | None = None
        try:
            check_access(c.fence, c.name, term)
        except Exception as exc:
            want = exc
        try:
            c.access(term)
            got: Exception | None = None
        except Exception as exc:
            got = exc
        assert (type(got), str(got)) == (type(want), str(want)), (term, t, at, serving, role)
        checked += want is None
    assert checked > 0  # the open case was among them


# ----------------------------------------------------------------- offsets and producers


def test_offsets_are_dense_and_a_failed_write_hands_them_out_again() -> None:
    c = assigned(1)
    first = c.append(1, 2, 1000)
    second = c.append(1, 3, 1000)
    assert (first.base, second.base) == (0, 2) and second.first_tick > first.first_tick
    assert c.written(0, 2, 20, 1, None, ledger=True)[0] == MarkDurable(2)
    assert kinds(c.write_failed([])) == ["Notify"]
    assert (c.committed_next, c.next_offset) == (2, 2)
    assert c.append(1, 1, 1000).base == 2


def test_a_resent_batch_is_answered_not_appended_and_a_failed_one_is_forgotten() -> None:
    c = assigned(1)
    got = c.append(1, 2, 1000, producer=("p", 1))
    assert c.append(1, 2, 1000, producer=("p", 1)) == Resend(got_result(got, 2), True)
    c.written(0, 2, 20, 1, ("p", 1), ledger=True)
    assert c.append(1, 2, 1000, producer=("p", 1)) == Resend(got_result(got, 2), False)
    c.append(1, 1, 1000, producer=("p", 2))
    c.write_failed([("p", 2)])
    again = c.append(1, 1, 1000, producer=("p", 2))
    assert isinstance(again, Accepted) and again.base == 2


def got_result(got: Accepted, count: int):
    from streamwal.node.producers import BatchResult

    return BatchResult(got.base, got.first_tick, count)


# ----------------------------------------------------------------- replication


def test_a_leader_commits_on_a_majority_and_answers_its_waiters() -> None:
    c = assigned(1, LEAD)
    assert any(isinstance(e, AppendTick) for e in run(c.assign(1, LEAD))[0]) is False
    write_all(c, 1)  # the tick a new leader appends
    write_all(c, 4)
    assert c.commit == 0 and c.wait_commit(1, 5, "w") == []
    c.open_stream(2, 1, [], 0)
    assert c.acked(2, 1, 3, sent=5) == [Notify()] and c.commit == 3
    assert c.acked(2, 1, 5, sent=5) == [Answer(("w",)), Notify()] and c.commit == 5
    assert c.visible_next == 5


def test_followers_ahead_of_the_leaders_fsync_commit_only_what_it_made_durable() -> None:
    """Records reach the followers while the leader's own fsync runs: both may acknowledge
    more than the leader holds durably; the commit stops at the leader's durable end."""
    c = assigned(1, LEAD)
    write_all(c, 1)  # the new leader's tick
    c.append(1, 4, 1000)  # on its way to the disk, and to the followers
    assert c.wait_commit(1, 5, "w") == []
    c.open_stream(2, 1, [], 1)
    c.open_stream(3, 1, [], 1)
    c.acked(2, 1, 5, sent=5)
    c.acked(3, 1, 5, sent=5)
    assert c.commit == 1 and c.visible_next == 1  # a majority holds 5; the leader 1
    effects = c.written(1, 4, 40, 1, None, ledger=True)
    assert Answer(("w",)) in effects and c.commit == 5


def test_a_leaders_failed_write_ends_its_role_until_a_new_term() -> None:
    """Its followers may hold the failed records: the offsets are not handed out again
    under that term (two records at one term and offset), so the role ends, the pchannel
    waits for an Assign, and only a new term is led here."""
    c = assigned(1, LEAD)
    write_all(c, 1)
    c.append(1, 4, 1000)
    assert c.wait_commit(1, 5, "w") == []
    effects = c.write_failed([])
    assert isinstance(effects[0], Fail) and effects[0].tokens == ("w",)
    assert c.role is None and (c.committed_next, c.next_offset) == (1, 1)
    with pytest.raises(ChannelNotExist, match="recovering"):
        c.append(1, 1, 1000)
    assert not c.reported  # the coord sees its leader missing: a term change
    with pytest.raises(ChannelFenced, match="only under a new term"):
        run(c.assign(1, LEAD))
    run(c.assign(2, LEAD))
    assert c.role is not None and c.append(2, 1, 1000).base == 1


def test_older_terms_records_commit_only_with_one_of_the_leaders_own_term() -> None:
    """Raft's figure 8: a majority holding an older term's records is not enough."""
    meta = ChannelMeta(term=1, serving=True, assigned_term=1, history=[(1, 0)])
    c = core(meta, end=10, last_term=1, commit=4)
    effects, _ = run(c.assign(2, LEAD))
    assert AppendTick(2) in effects and c.meta.history == [(1, 0), (2, 10)]
    c.open_stream(2, 2, [(1, 0)], 10)
    c.acked(2, 2, 10, sent=10)
    assert c.commit == 4  # 10 is on a majority, but all of it is from term 1
    write_all(c, 1)  # the tick of term 2 at offset 10
    c.acked(2, 2, 11, sent=11)
    assert c.commit == 11


def test_a_follower_cuts_where_the_logs_part_then_copies_verbatim() -> None:
    meta = ChannelMeta(term=2, serving=True, assigned_term=2, history=[(1, 0), (3, 5)])
    leader = core(meta, end=9, last_term=3, commit=5)
    run(leader.assign(3, LEAD))
    start = leader.open_stream(2, 3, [(1, 0), (2, 5)], 8)
    assert (start.position, start.truncate_from) == (5, 5)

    meta = ChannelMeta(term=3, serving=True, assigned_term=3, history=[(1, 0), (2, 5)])
    f = core(meta, end=8, last_term=2, commit=5)
    run(f.assign(3, FOLLOW_B))
    record = records.encode(3, 7000, 2, b"")
    outcomes = {Truncate: (30, 1)}
    effects, changed = run(
        f.apply([Entry(3, truncate_from=5), Entry(3, 5, record, commit_offset=6)]), outcomes
    )
    assert changed and kinds(effects) == [
        "Truncate",
        "PersistMeta",
        "Store",
        "MarkDurable",
        "Notify",
    ]
    assert f.meta.history == [(1, 0), (3, 5)] and (f.committed_next, f.commit) == (7, 6)
    assert f.unclean_cuts == 0  # the cut kept everything known committed (below 5)


def test_every_entry_passes_the_entry_rule_commit_updates_too() -> None:
    f = core(ChannelMeta(term=3, serving=True, assigned_term=3, history=[(1, 0)]), end=4)
    run(f.assign(3, FOLLOW_B))
    with pytest.raises(rules.Rejected, match="below the accepted term 3"):
        run(f.apply([Entry(2, commit_offset=4)]))  # a stale leader's commit update
    with pytest.raises(rules.Rejected, match="following term 3"):
        run(f.apply([Entry(4, commit_offset=4)]))
    with pytest.raises(rules.Rejected, match="log ends at 4"):
        run(f.apply([Entry(3, 6, records.encode(3, 1, 1, b""))]))
    run(f.fence_term(5))  # a higher term accepted meanwhile: the role ended
    with pytest.raises(rules.Rejected, match="not a follower"):
        run(f.apply([Entry(3, commit_offset=4)]))


def test_a_cut_below_the_commit_offset_is_counted_as_unclean() -> None:
    f = core(ChannelMeta(term=3, serving=True, assigned_term=3, history=[(1, 0)]), end=8)
    f.commit = 7
    run(f.assign(3, FOLLOW_B))
    run(f.apply([Entry(3, truncate_from=5)]), {Truncate: (0, 1)})
    assert f.unclean_cuts == 1 and f.commit == 5


def test_follow_and_stop_following() -> None:
    f = core()
    effects, _ = run(f.assign(1, FOLLOW_B))
    assert StartFollowing in [type(e) for e in effects]
    effects, _ = run(f.fence_term(2))
    assert kinds(effects)[:2] == ["StopFollowing", "Notify"]


def test_catch_up_failure_propagates() -> None:
    c = core()
    with pytest.raises(ChannelNotExist):
        run(c.assign(1, catch_up_from="b:2"), {CatchUp: ChannelNotExist("gone")})


# ----------------------------------------------------------------- damage and invariants


def test_a_log_below_its_acknowledged_mark_is_refused_until_the_loss_is_accepted() -> None:
    meta = ChannelMeta(term=2, serving=True, assigned_term=2, history=[(2, 0)])
    c = core(meta, end=5, ledger_mark=9)
    assert "acknowledged offsets up to 8" in c.damage
    with pytest.raises(DataLoss):
        run(c.assign(3))
    effects, _ = run(c.fence_term(3))
    assert effects[-1] == PersistMeta(c.meta) and run(c.fence_term(3))[1][2] == 9
    _, outcome = run(c.assign(4, accept_data_loss=True))
    assert outcome is AssignOutcome.TAKE and c.meta.history[-1] == (4, 9)
    assert c.append(4, 1, 1000).base == 9  # never an offset acknowledged before


def test_invariants_are_asserted() -> None:
    c = assigned(1, LEAD)
    write_all(c, 3)
    c.open_stream(2, 1, [], 0)
    c.acked(2, 1, 3, sent=3)
    c.commit = 1  # a bug moving the commit back
    with pytest.raises(InvariantBroken, match="commit went back"):
        c.check()
    d = assigned(5)
    d.meta = replace(d.meta, term=4)
    with pytest.raises(InvariantBroken, match="term went back"):
        d.check()
    e = assigned(1)
    e.append(1, 2, 1000)
    with pytest.raises(InvariantBroken, match="write at 1"):
        e.written(1, 1, 10, 1, None, ledger=False)


def test_effects_of_a_leader_losing_its_role_fail_quorum_waiters_once() -> None:
    c = assigned(1, LEAD)
    write_all(c, 2)
    assert c.wait_commit(1, 2, "x") == []
    (refused,) = c.wait_commit(2, 2, "y")
    assert isinstance(refused, Fail) and refused.tokens == ("y",)
    effects, _ = run(c.remove(1))
    assert [type(e) for e in effects][:1] == [Fail] and effects[0].tokens == ("x",)
    assert not any(isinstance(e, StopFollowing) for e in effects)
    assert isinstance(effects[-1], PersistMeta) and not isinstance(effects[-1], Store)


def test_a_failed_write_of_copied_records_takes_the_log_back_not_the_term() -> None:
    f = core(ChannelMeta(term=3, serving=True, assigned_term=3, history=[(1, 0)]), end=4)
    run(f.assign(3, FOLLOW_B))
    steps = f.apply([Entry(3, 4, records.encode(3, 9, 2, b"", producer=("p", 7)))])
    store = next(steps)
    assert isinstance(store, Store) and f.committed_next == 6 and f.meta.history[-1] == (3, 4)
    run(f.fence_term(5))  # a fence moved the term while the write was in flight
    f.unstore(store.staged)  # the write failed
    assert (f.committed_next, f.next_offset, f.meta.history, f.term) == (4, 4, [(1, 0)], 5)
    assert f.producers == {} and f.commit == 4


def test_a_fence_reports_the_term_of_the_last_record_written_not_its_own() -> None:
    c = assigned(1)
    c.append(1, 1, 1000)  # in flight when the fence comes
    steps = c.fence_term(3)
    assert isinstance(next(steps), PersistMeta) and isinstance(next(steps), Drain)
    c.written(0, 1, 10, 1, None, ledger=True)
    _, report = run(steps)
    assert report == (1, 1, 1, "")
