"""The pure replication rules: commit offset, ack levels, where a follower starts, and
what a follower accepts."""

from __future__ import annotations

import pytest

from streamwal.node import replication_rules as rules
from streamwal.node.divergence import cut_history, extend_history, term_at
from streamwal.node.producers import BatchResult, ProducerState, window_below
from streamwal.proto import streaming_pb2 as pb


def test_commit_is_the_end_stored_on_a_majority() -> None:
    # 3 members: leader at 100, followers at 80 and 50 -> 80 is on two of three
    assert rules.commit_offset(0, 100, [80, 50], 3, 0) == 80
    assert rules.commit_offset(0, 100, [50], 3, 0) == 50  # a silent follower counts 0
    assert rules.commit_offset(0, 100, [], 3, 0) == 0
    assert rules.commit_offset(0, 100, [], 1, 0) == 100  # alone: synced is committed
    # 5 members need 3
    assert rules.commit_offset(0, 100, [90, 70, 10, 0], 5, 0) == 70
    assert rules.commit_offset(0, 100, [90, 0, 0, 0], 5, 0) == 0
    # never moves back (a follower that lost its disk acks less)
    assert rules.commit_offset(80, 100, [10, 20], 3, 0) == 80


def test_only_a_current_term_record_is_committed_by_counting() -> None:
    # the leader took its term at 60; older-term records 40..60 on a majority are not
    # committed until a record of its own term (>= 60) is
    assert rules.commit_offset(40, 100, [60, 55], 3, 60) == 40
    assert rules.commit_offset(40, 100, [61, 55], 3, 60) == 61


def test_ack_levels() -> None:
    assert rules.quorum_ack(pb.ACK_LEVEL_DEFAULT, 3)
    assert not rules.quorum_ack(pb.ACK_LEVEL_DEFAULT, 1)
    assert rules.quorum_ack(pb.ACK_LEVEL_QUORUM, 1)
    assert not rules.quorum_ack(pb.ACK_LEVEL_LEADER, 3)


def test_follower_start_cuts_only_what_diverges() -> None:
    leader = [(1, 0), (3, 50)]
    assert rules.follower_start([(1, 0)], 40, leader, 90) == rules.Start(40, None)
    assert rules.follower_start([], 0, leader, 90) == rules.Start(0, None)
    # an old leader's stranded term-1 tail past 50
    assert rules.follower_start([(1, 0)], 70, leader, 90) == rules.Start(50, 50)
    # a follower ahead of the leader in the same term (the leader never got the tail)
    assert rules.follower_start([(1, 0), (3, 50)], 95, leader, 90) == rules.Start(90, 90)
    # a term the leader never saw (2, from 45), while the leader has term-1 records there
    follower = [(1, 0), (2, 45)]
    assert rules.follower_start(follower, 60, [(1, 0), (4, 50)], 70) == rules.Start(45, 45)


def test_history_follows_the_records() -> None:
    assert extend_history([], 1, 0) == [(1, 0)]
    assert extend_history([(1, 0)], 1, 10) is None
    assert extend_history([(1, 0)], 2, 10) == [(1, 0), (2, 10)]
    # a term taken at 10 that wrote nothing, then an older term's record at 10
    assert extend_history([(1, 0), (3, 10)], 2, 10) == [(1, 0), (2, 10)]
    assert extend_history([(1, 0), (3, 10)], 1, 10) == [(1, 0)]
    assert cut_history([(1, 0), (2, 10), (3, 20)], 20) == [(1, 0), (2, 10)]
    assert term_at([(1, 0), (2, 10), (3, 10)], 10) == 3
    assert term_at([(2, 10)], 5) == 0


def test_follower_accepts_only_its_leader_term_in_order() -> None:
    rules.check_entry(5, 5, 5, 100, 100)
    with pytest.raises(rules.Rejected, match="below the accepted term"):
        rules.check_entry(5, 6, 5, 100, 100)
    with pytest.raises(rules.Rejected, match="following term 5"):
        rules.check_entry(5, 5, 6, 100, 100)
    with pytest.raises(rules.Rejected, match="log ends at 100"):
        rules.check_entry(5, 5, 5, 120, 100)
    rules.check_truncate(90, 100)
    with pytest.raises(rules.Rejected, match="beyond the log end"):
        rules.check_truncate(110, 100)


def test_a_cut_keeps_the_producer_results_below_it() -> None:
    state = ProducerState()
    for seq, base in ((1, 0), (2, 10), (3, 20)):
        state.add(seq, BatchResult(base, 100 + base, 10))
    kept = ProducerState.decode(window_below(state.encode_upto(3), 20))
    assert kept.accepted == 2 and list(kept.results) == [1, 2]
    assert window_below(state.encode_upto(3), 0) == b""
