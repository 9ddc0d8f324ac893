"""Leader election decisions (operator/election.py), pure: a table of observations and
clock readings, the decision each gives."""

from __future__ import annotations

import pytest

from streamwal.operator import election as el

CFG = el.ElectionConfig()  # 15 s lease, 10 s renew deadline, 2 s retry


def held(holder: str, renewed: str, transitions: int = 0, version: str = "7") -> el.LeaseRecord:
    return el.LeaseRecord(holder, 15.0, transitions, renewed, version)


def test_an_absent_lease_is_created_and_a_released_one_taken_at_once() -> None:
    e = el.Election("b", CFG)
    e.observe(None, 100.0)
    assert e.decide(100.0) == el.Write("b", 15.0, 0, True, None)
    e.observe(el.LeaseRecord("", 1.0, 3, "t", "9"), 101.0)  # released by its holder
    assert e.decide(101.0) == el.Write("b", 15.0, 4, True, "9")


def test_a_standby_takes_over_lease_duration_after_the_last_renewal_it_saw() -> None:
    e = el.Election("b", CFG)
    for t, renewed in ((100.0, "r1"), (102.0, "r2"), (104.0, "r3")):  # renewed every 2 s
        e.observe(held("a", renewed), t)
        assert isinstance(e.decide(t), el.Wait)
    # r3 committed after the read at 102 that still showed r2: expiry at 102 + 15.
    for t in (106.0, 108.0, 110.0, 112.0, 114.0, 116.0):
        e.observe(held("a", "r3"), t)
        wait = e.decide(t)
        assert isinstance(wait, el.Wait) and wait.seconds == min(2.0, 117.0 - t)
    e.observe(held("a", "r3"), 117.0)
    assert e.decide(117.0) == el.Write("b", 15.0, 1, True, "7")


def test_a_first_sight_counts_from_one_retry_period_before_the_read() -> None:
    e = el.Election("b", CFG)
    e.observe(held("a", "r1"), 50.0)
    assert e.decide(62.9) == el.Wait(pytest.approx(0.1))  # 50 - 2 + 15 = 63
    assert isinstance(e.decide(63.0), el.Write)


def test_the_leader_renews_every_retry_period_and_stops_at_the_renew_deadline() -> None:
    e = el.Election("a", CFG)
    e.observe(None, 0.0)
    write = e.decide(0.0)
    assert isinstance(write, el.Write)
    e.wrote(write, "1", "r0", 0.0)
    assert e.leading and e.decide(1.0) == el.Wait(1.0)
    e.observe(held("a", "r0", version="1"), 2.0)
    assert e.decide(2.0) == el.Write("a", 15.0, 0, False, "1")
    # Renewals fail from here on (the API is unreachable): acting stops at 0 + 10 s.
    assert isinstance(e.decide(9.9), el.Write)
    assert e.decide(10.0) == el.Lost("not renewed for 10 s")


def test_a_leader_that_sees_another_holder_has_lost() -> None:
    e = el.Election("a", CFG)
    e.observe(None, 0.0)
    e.wrote(e.decide(0.0), "1", "r0", 0.0)  # type: ignore[arg-type]
    e.observe(held("b", "x", transitions=1), 2.0)
    assert e.decide(2.0) == el.Lost("the Lease is held by b")


def test_the_same_identity_takes_its_lease_back_at_once() -> None:
    """A restarted container of the same pod (the old process is gone)."""
    e = el.Election("pod-0", CFG)
    e.observe(held("pod-0", "r9", transitions=2), 10.0)
    assert e.decide(10.0) == el.Write("pod-0", 15.0, 2, False, "7")


def test_a_standby_waits_past_the_old_leaders_renew_deadline() -> None:
    """Safety: the old leader acts until its last renewal + 10 s; a standby that saw that
    renewal (however late its read) acts no earlier than 13 s after it."""
    for read_delay in (0.0, 0.5, 1.0, 1.9):
        e = el.Election("b", CFG)
        renewal = 20.0
        e.observe(held("a", "r0"), renewal - 2.0 + read_delay - 0.01)
        e.observe(held("a", "r1"), renewal + read_delay)
        first_write = next(
            t / 10 for t in range(200, 400) if isinstance(e.decide(t / 10), el.Write)
        )
        assert first_write >= renewal + CFG.renew_deadline + 2.9


@pytest.mark.parametrize(("duration", "deadline", "retry"), [(15, 14, 2), (10, 10, 2), (15, 10, 0)])
def test_inconsistent_timings_are_refused(duration: float, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline"):
        el.ElectionConfig(duration, deadline, retry)
