"""Liveness: interval and grace period over a fake clock (the logic is pure)."""

from __future__ import annotations

import pytest

from streamwal.coord.liveness import Liveness, LivenessTracker, LossPolicy, refused


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


def test_pings_keep_a_node_whose_status_probes_time_out_live():
    """Slow is not dead: the status path fails (a loaded loop), pings answer."""
    t = LivenessTracker(interval=0.5, grace=1.5)
    t.track(1, now=0.0)
    assert t.observe(1, True, now=0.0).joined
    assert t.heard(1, True, at=0.1, now=0.1) is None
    changes = []
    for step in range(1, 41):  # 20 s of status timeouts, a ping answered every 0.5 s
        now = step * 0.5
        changes.append(t.observe(1, False, now=now))
        changes.append(t.heard(1, True, at=now + 0.1, now=now + 0.1))
        changes += t.tick(now)
    assert [c for c in changes if c] == [] and t.state(1) == Liveness.LIVE


def test_both_signals_must_fail_through_the_grace():
    t = LivenessTracker(interval=0.5, grace=1.5)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    t.heard(1, True, at=0.0, now=0.0)
    assert t.heard(1, False, at=0.5, now=0.5) is None  # status still ok: live
    assert t.observe(1, False, now=0.6).after == Liveness.SUSPECT
    assert t.tick(now=1.5) == []
    assert [c.after for c in t.tick(now=1.6)] == [Liveness.LOST]


def test_a_late_ping_outcome_counts_when_it_arrived():
    """The coord's loop may read a ping late; its arrival time decides."""
    t = LivenessTracker(interval=0.5, grace=1.5)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    t.observe(1, False, now=1.0)
    assert t.heard(1, True, at=1.4, now=2.5).after == Liveness.LIVE  # read 1.1 s late
    t2 = LivenessTracker(interval=0.5, grace=1.5)
    t2.track(1, now=0.0)
    t2.observe(1, True, now=0.0)
    assert t2.heard(1, True, at=1.0, now=2.0) is None  # within grace of 1.0: still live


@pytest.mark.parametrize(
    ("nodes", "dead", "declared"),
    [
        (1, 1, 1),  # a lone node may always be lost
        (2, 1, 1),
        (3, 1, 1),
        (3, 2, 0),  # 2 of 3 looking dead: the coord more likely is the problem
        (4, 2, 2),
        (4, 3, 0),
        (4, 4, 0),  # everyone silent: the coord is cut off, declare nothing
        (10, 5, 5),
        (10, 6, 0),
    ],
)
def test_no_large_share_of_the_cluster_is_lost_at_once(nodes, dead, declared):
    t = LivenessTracker(interval=0.5, grace=1.0, policy=LossPolicy(max_share=0.55, gap=0.0))
    for n in range(nodes):
        t.track(n, now=0.0)
        t.observe(n, True, now=0.0)
    for n in range(dead, nodes):
        t.observe(n, True, now=2.0)
    lost = [c.node for c in t.tick(now=2.0) if c.lost]
    assert len(lost) == declared
    assert t.held(2.0) == sorted(set(range(dead)) - set(lost))


def test_losses_are_spaced_by_the_gap_and_a_node_that_answers_is_not_lost():
    t = LivenessTracker(interval=0.5, grace=1.0, policy=LossPolicy(max_share=0.55, gap=2.0))
    for n in range(5):
        t.track(n, now=0.0)
        t.observe(n, True, now=0.0)
    for now in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):
        for n in (2, 3, 4):
            t.observe(n, True, now=now)
    assert [c.node for c in t.tick(now=1.5) if c.lost] == [0]
    assert t.held(1.5) == [1] and t.state(1) == Liveness.SUSPECT
    assert [c.node for c in t.tick(now=2.5) if c.lost] == []
    assert [c.node for c in t.tick(now=3.0) if c.lost] == []
    assert [c.node for c in t.tick(now=3.5) if c.lost] == [1]
    # node 0 comes back; a later loss is again allowed after the gap
    assert t.observe(0, True, now=4.0).joined


def test_policy_table():
    p = LossPolicy(max_share=0.55, gap=1.0)
    assert p.allows(dead=1, nodes=4, last_loss=None, now=0.0)
    assert not p.allows(dead=1, nodes=4, last_loss=0.5, now=1.0)
    assert p.allows(dead=2, nodes=4, last_loss=0.0, now=1.0)
    assert not p.allows(dead=3, nodes=4, last_loss=None, now=1.0)


def test_a_coord_that_did_not_run_judges_no_node_by_its_own_absence():
    """The coord's loop (or process) starved for 3 s: when it wakes, its nodes are not
    lost for the time it was not watching; a node still silent afterwards is."""
    t = LivenessTracker(interval=0.5, grace=1.5)
    for n in (1, 2):
        t.track(n, now=0.0)
        t.observe(n, True, now=0.0)
    assert t.tick(now=0.5) == []
    assert t.tick(now=3.5) == []  # woke up 3 s late: 2.5 s credited
    assert t.state(1) == Liveness.LIVE
    t.observe(1, True, now=3.6)
    lost = {}
    for step in range(1, 9):  # ticking every 0.25 s again; node 2 stays silent
        now = 3.5 + step * 0.25
        lost.update({c.node: now for c in t.tick(now) if c.lost})
    assert lost == {2: 4.25}  # its last answer (0.0) + the stall (2.5) + the grace (1.5)


def test_pings_drained_late_are_judged_together_after_the_stall_is_credited():
    """The coord's loop stalled 3 s; meanwhile one ping timed out and the next answered.
    Judged one by one before the stall was credited, the node went SUSPECT and LIVE in
    the same millisecond (healthy nodes flapped so at 1,024 x RF=3, issue 24)."""
    t = LivenessTracker(interval=0.5, grace=1.5)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    t.heard(1, True, at=0.0, now=0.0)
    assert t.tick(now=0.25) == []
    t.observe(1, False, now=0.5)  # the status probe timed out as the loop stalled
    assert t.heard_all([(1, False, 1.0, False), (1, True, 3.0, False)], now=3.3) == []
    assert t.state(1) == Liveness.LIVE
    # Judged once, on the latest outcome: a SUSPECT node whose last ping answered.
    t2 = LivenessTracker(interval=0.5, grace=1.5)
    t2.track(1, now=0.0)
    t2.observe(1, True, now=0.0)
    assert t2.observe(1, False, now=0.5).after == Liveness.SUSPECT  # no ping heard yet
    changes = t2.heard_all([(1, False, 0.6, False), (1, True, 1.1, False)], now=1.2)
    assert [(c.node, c.after) for c in changes] == [(1, Liveness.LIVE)]
    changes = t2.heard_all([(1, True, 1.3, False), (1, False, 1.4, False)], now=1.5)
    assert [(c.node, c.after) for c in changes] == [(1, Liveness.SUSPECT)]


@pytest.mark.parametrize(
    ("status", "ping", "down"),
    [
        # (latest status outcome, latest ping outcome): ok / refused / timeout / none
        ("refused", "refused", True),  # nothing listens on either port: the process is gone
        ("refused", "timeout", False),  # the probe port may just be slow
        ("timeout", "refused", False),
        ("timeout", "timeout", False),  # loaded or cut off: slow is not dead
        ("refused", "none", False),  # no probe port: only the grace decides
        ("refused", "ok", False),  # the pings answer: alive
        ("ok", "refused", False),  # restarted, status answers (its ping backs off)
    ],
)
def test_known_down_needs_both_signals_refused(status: str, ping: str, down: bool) -> None:
    t = LivenessTracker(interval=0.5, grace=30.0)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    if ping != "none":
        t.heard(1, ping == "ok", at=0.1, now=0.1, refused=ping == "refused")
    t.observe(1, status == "ok", now=0.2, refused=status == "refused")
    assert (t.down() == {1}) is down
    # Known dead is not lost: the grace still decides that (single replicas wait for it).
    assert t.state(1) != Liveness.LOST and t.alive() == {1}


def test_a_refused_ping_brings_the_status_probe_forward_once() -> None:
    t = LivenessTracker(interval=0.5, grace=30.0)
    t.track(1, now=0.0)
    t.observe(1, True, now=0.0)
    t.heard(1, True, at=0.0, now=0.0)
    assert t.due(0.1) == []
    t.heard(1, False, at=0.1, now=0.1, refused=True)
    assert t.due(0.1) == [1]  # ask the status port now, not in 0.4 s
    assert not t.wants_ping(1)
    t.observe(1, False, now=0.11, refused=True)
    assert t.down() == {1}
    t.heard(1, False, at=0.2, now=0.2, refused=True)
    assert t.due(0.2) == []  # once: the schedule is the interval again
    t.observe(1, True, now=0.7)  # back
    assert t.down() == set()


def test_a_refused_status_probe_wants_a_ping() -> None:
    t = LivenessTracker(interval=0.5, grace=30.0)
    t.track(1, now=0.0)
    t.heard(1, True, at=0.0, now=0.0)
    t.observe(1, False, now=0.1, refused=True)
    assert t.wants_ping(1) and t.down() == set()
    t.heard(1, False, at=0.12, now=0.12, refused=True)
    assert not t.wants_ping(1) and t.down() == {1}


def test_refused_recognises_grpc_connection_refusals() -> None:
    assert refused(
        "unavailable: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:5: Failed to connect to remote host: Connection refused"
    )
    assert not refused("deadline exceeded: Deadline Exceeded")
