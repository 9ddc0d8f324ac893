"""Placement and rebalancing decisions."""

from __future__ import annotations

from streamwal.coord import balancer as bl


def test_choose_least_loaded_live_non_drained():
    placement = {"a": 1, "b": 1, "c": 2}
    assert bl.choose_node(placement, live={1, 2, 3}, drained=()) == 3
    assert bl.choose_node(placement, live={1, 2}, drained=()) == 2
    assert bl.choose_node(placement, live={1, 2, 3}, drained={3}) == 2
    assert bl.choose_node(placement, live=set(), drained=()) is None
    assert bl.choose_node({}, live={5, 4}, drained={4, 5}) is None


def test_place_spreads_a_batch_evenly():
    targets = bl.place([f"ch_{i}" for i in range(7)], {}, live={1, 2, 3}, drained=())
    counts = bl.loads(targets, [1, 2, 3])
    assert sorted(counts.values()) == [2, 2, 3]
    assert bl.place(["x"], {}, live=(), drained=()) == {}


def test_rebalance_after_join_moves_at_most_the_step_and_improves():
    placement = {f"ch_{i}": 1 + i % 2 for i in range(6)}  # 3 on node 1, 3 on node 2
    moves = bl.rebalance(placement, live={1, 2, 3}, drained=(), max_moves=1)
    assert len(moves) == 1 and moves[0].target == 3
    moves = bl.rebalance(placement, live={1, 2, 3}, drained=(), max_moves=10)
    after = dict(placement)
    for m in moves:
        assert after[m.channel] == m.source
        after[m.channel] = m.target
    assert len(moves) == 2
    assert sorted(bl.loads(after, [1, 2, 3]).values()) == [2, 2, 2]


def test_rebalance_respects_tolerance_and_zero_budget():
    placement = {"a": 1, "b": 1, "c": 2}
    assert bl.rebalance(placement, live={1, 2}, drained=(), max_moves=5) == []
    placement = {"a": 1, "b": 1, "c": 1, "d": 1}
    assert bl.rebalance(placement, live={1, 2}, drained=(), max_moves=5, tolerance=4) == []
    assert len(bl.rebalance(placement, live={1, 2}, drained=(), max_moves=5, tolerance=1)) == 2
    assert bl.rebalance(placement, live={1, 2}, drained=(), max_moves=0) == []


def test_drained_node_is_emptied_first_within_the_step():
    placement = {"a": 1, "b": 1, "c": 2, "d": 3}
    moves = bl.rebalance(placement, live={1, 2, 3}, drained={1}, max_moves=1)
    assert moves == [bl.Move("a", 1, 2)]
    moves = bl.rebalance(placement, live={1, 2, 3}, drained={1}, max_moves=5)
    assert {m.channel for m in moves} == {"a", "b"}
    assert all(m.target in (2, 3) for m in moves)


def test_lost_nodes_are_not_rebalanced_here():
    placement = {"a": 9, "b": 1}
    assert bl.rebalance(placement, live={1, 2}, drained=(), max_moves=5) == []
