"""Liveness: interval and grace period over a fake clock (the logic is pure)."""

from __future__ import annotations

import pytest

from streamwal.coord.liveness import Liveness, LivenessTracker


def test_probe_schedule_follows_interval():
    t = LivenessTracker(interval=1.0, grace=3.0)
    t.track(1, now=0.0)
    t.track(2, now=0.0)
    assert t.due(0.0) == [1, 2]
    t.observe(1, True, now=0.0)
    assert t.due(0.5) == [2]
    assert t.due(1.0) == [1, 2]


def test_join_suspect_lost_and_back():
    t = LivenessTracker(interval=1.0, grace=3.0)
    t.track(1, now=0.0)
    assert t.state(1) == Liveness.UNKNOWN
    change = t.observe(1, True, now=0.1)
    assert change and change.joined and t.live() == {1}
    assert t.observe(1, False, now=1.0).after == Liveness.SUSPECT
    assert t.alive() == {1} and t.live() == set()
    assert t.observe(1, False, now=3.0) is None  # still within grace of the success at 0.1
    change = t.observe(1, False, now=3.2)
    assert change and change.lost and t.alive() == set()
    change = t.observe(1, True, now=10.0)
    assert change and change.joined and change.before == Liveness.LOST


def test_never_answering_node_is_lost_after_grace():
    t = LivenessTracker(interval=1.0, grace=2.0)
    t.track(7, now=0.0)
    assert t.observe(7, False, now=1.0) is None
    assert t.state(7) == Liveness.UNKNOWN
    assert [c.node for c in t.tick(now=2.5) if c.lost] == [7]


def test_tick_loses_a_node_whose_probes_hang():
    t = LivenessTracker(interval=1.0, grace=2.0)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    assert t.tick(now=1.9) == []
    assert [c.lost for c in t.tick(now=2.1)] == [True]


def test_rejects_bad_config():
    with pytest.raises(ValueError):
        LivenessTracker(interval=0, grace=1)
