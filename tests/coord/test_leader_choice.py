"""Leader choice from Fence reports: majority required, never a log missing a committed offset."""

from __future__ import annotations

import itertools

import pytest

from streamwal.coord.leader_choice import (
    Choice,
    FenceReport,
    NoChoice,
    choose_leader,
    has_quorum,
    majority,
)


def reports(*rows: tuple[int, int, int]) -> dict[int, FenceReport]:
    return {n: FenceReport(n, term, end) for n, term, end in rows}


def test_majority_sizes() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_needs_a_majority_of_every_voting_set() -> None:
    assert has_quorum({1, 2}, [[1, 2, 3]])
    assert not has_quorum({1}, [[1, 2, 3]])
    # joint: {1,2} is a majority of the old set, not of the new {2,4,5}
    assert not has_quorum({1, 2}, [[2, 4, 5], [1, 2, 3]])
    assert has_quorum({1, 2, 4}, [[2, 4, 5], [1, 2, 3]])
    assert has_quorum({1}, [[1], []])


def test_one_answer_of_three_chooses_nothing() -> None:
    got = choose_leader(reports((2, 5, 100)), [[1, 2, 3]], candidates=[1, 2, 3])
    assert isinstance(got, NoChoice)
    assert "no majority" in got.reason


def test_highest_term_beats_longer_log() -> None:
    # node 1 holds a longer log of an old term: an uncommitted suffix a later leader skipped
    got = choose_leader(reports((1, 3, 90), (2, 4, 70)), [[1, 2, 3]], candidates=[1, 2, 3])
    assert got == Choice(2, 70)


def test_same_term_longer_log_wins_and_rank_breaks_ties() -> None:
    got = choose_leader(reports((1, 4, 70), (2, 4, 75)), [[1, 2, 3]], candidates=[1, 2, 3])
    assert got == Choice(2, 75)
    tie = reports((1, 4, 75), (2, 4, 75), (3, 4, 75))
    assert choose_leader(tie, [[1, 2, 3]], [1, 2, 3], rank=lambda n: (n != 3, n)) == Choice(3, 75)


def test_joining_nodes_do_not_vote_and_a_best_log_outside_the_set_blocks() -> None:
    # node 4 joins with a stale log of a high term: it must not win
    got = choose_leader(
        reports((1, 4, 70), (2, 4, 70), (4, 9, 500)), [[1, 2, 3]], candidates=[1, 2, 4]
    )
    assert got == Choice(1, 70)
    got = choose_leader(reports((1, 4, 70), (2, 4, 60)), [[1, 2, 3]], candidates=[2, 3])
    assert isinstance(got, NoChoice)


def test_refuses_a_best_log_below_a_known_commit_offset() -> None:
    rows = {1: FenceReport(1, 4, 50, commit_offset=60), 2: FenceReport(2, 4, 55)}
    assert isinstance(choose_leader(rows, [[1, 2, 3]], [1, 2, 3]), NoChoice)


def test_never_misses_a_committed_offset_exhaustive() -> None:
    """Every way three replicas can hold prefixes of one history: a committed offset (on two
    of three) is always held by the choice of any two answering replicas."""
    # history of offsets 0..5 with the terms that wrote them; logs are prefixes of it
    ends = range(0, 7)
    term_of = [1, 1, 2, 2, 3, 3]

    def last_term(end: int) -> int:
        return term_of[end - 1] if end else 0

    for logs in itertools.product(ends, repeat=3):
        committed = sorted(logs)[1]  # offsets below it are on a majority
        for answered in itertools.combinations(range(3), 2):
            rows = {n + 1: FenceReport(n + 1, last_term(logs[n]), logs[n]) for n in answered}
            got = choose_leader(rows, [[1, 2, 3]], [1, 2, 3])
            assert isinstance(got, Choice)
            assert got.next_offset >= committed, (logs, answered, got)


def test_a_replica_that_lost_acknowledged_records_never_leads() -> None:
    # node 1 has the longest log, but its records fail their checksums: node 2 leads
    damaged = FenceReport(1, 4, 90, commit_offset=80, ineligible="record 40 unreadable")
    got = choose_leader(
        {1: damaged, 2: FenceReport(2, 4, 80), 3: FenceReport(3, 4, 60)},
        [[1, 2, 3]],
        candidates=[1, 2, 3],
    )
    assert got == Choice(2, 80)


def test_what_a_damaged_replica_acknowledged_must_be_held_by_the_leader() -> None:
    # node 1 acknowledged up to 90 (its commit floor): node 2 ends at 85, so electing it
    # would drop records the old leader and node 1 held: wait instead
    damaged = FenceReport(1, 4, 30, commit_offset=90, ineligible="log ends below 90")
    got = choose_leader({1: damaged, 2: FenceReport(2, 4, 85)}, [[1, 2, 3]], candidates=[1, 2, 3])
    assert isinstance(got, NoChoice)
    assert "below the known commit offset 90" in got.reason


def test_damaged_replicas_still_count_for_the_majority_but_cannot_lead_alone() -> None:
    got = choose_leader(
        {1: FenceReport(1, 4, 90, ineligible="x"), 2: FenceReport(2, 4, 90, ineligible="y")},
        [[1, 2, 3]],
        candidates=[1, 2, 3],
    )
    assert isinstance(got, NoChoice)
    assert "no answering replica may lead" in got.reason


def test_half_of_an_even_previous_set_meets_its_every_majority() -> None:
    """Placed on 2 nodes (a third was missing), grown to 3, leader 1 dead before the
    change completed: 2 (of the previous 2) and 3 answer, and 2 holds every committed
    record (the set of 2 committed only on both): it leads, nothing is missed."""
    assert has_quorum({2, 3}, [[1, 2, 3], [1, 2]])
    assert not has_quorum({3}, [[1, 2, 3], [1, 2]])
    assert has_quorum({2}, [[1, 2]]) and has_quorum({2, 3}, [[1, 2, 3, 4]])
    rows = {2: FenceReport(2, 3, 120, commit_offset=110), 3: FenceReport(3, 3, 90)}
    got = choose_leader(rows, [[1, 2, 3], [1, 2]], [1, 2, 3])
    assert got == Choice(2, 120)


@pytest.mark.parametrize("size", [2, 4])
def test_even_sets_never_miss_a_committed_offset_exhaustive(size: int) -> None:
    """Every way an even set's replicas hold prefixes of one history: what a majority
    stored is held by the choice of any answering half."""
    term_of = [1, 1, 2, 2, 3, 3]

    def last_term(end: int) -> int:
        return term_of[end - 1] if end else 0

    members = list(range(1, size + 1))
    for logs in itertools.product(range(0, 7), repeat=size):
        committed = sorted(logs, reverse=True)[majority(size) - 1]
        for answered in itertools.combinations(range(size), size // 2):
            rows = {n + 1: FenceReport(n + 1, last_term(logs[n]), logs[n]) for n in answered}
            got = choose_leader(rows, [members], members)
            assert isinstance(got, Choice)
            assert got.next_offset >= committed, (logs, answered, got)
