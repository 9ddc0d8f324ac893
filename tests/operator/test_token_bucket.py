"""The operator's request rate (`--kube-api-qps`, `--kube-api-burst`), as a table of
reservations: what a failover's burst of status writes and Events waits for."""

from __future__ import annotations

import pytest

from streamwal.operator.token_bucket import Throttled, TokenBucket


def test_a_burst_goes_at_once_then_requests_are_spaced_in_call_order() -> None:
    bucket = TokenBucket(rate=10, burst=3, max_wait=60)
    waits = [bucket.reserve(100.0) for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0, 0.1, 0.2, 0.3])  # first come, first served


def test_a_quiet_spell_refills_up_to_the_burst_and_no_more() -> None:
    bucket = TokenBucket(rate=10, burst=3, max_wait=60)
    for _ in range(3):
        bucket.reserve(0.0)
    assert bucket.reserve(0.15) == pytest.approx(0.0)  # 1.5 slots back, one taken
    assert bucket.reserve(100.0) == 0.0
    waits = [bucket.reserve(100.0) for _ in range(4)]
    assert waits == pytest.approx([0, 0, 0.1, 0.2])  # 3 in the bucket after 100 s, not 1,000


def test_a_wait_over_the_bound_is_refused_and_takes_no_slot() -> None:
    bucket = TokenBucket(rate=1, burst=1, max_wait=2.5)
    assert [bucket.reserve(0.0) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Throttled, match=r"over the 2\.5s bound"):
        bucket.reserve(0.0)
    assert bucket.reserve(1.0) == pytest.approx(2.0)  # the refused call left its slot


def test_the_servers_retry_after_holds_every_request() -> None:
    bucket = TokenBucket(rate=100, burst=100, max_wait=60)
    bucket.pause(now=10.0, seconds=2.0)
    assert bucket.reserve(10.5) == pytest.approx(1.5)
    assert bucket.reserve(12.0) == 0.0
    bucket.pause(now=12.0, seconds=-1)  # a bad header never moves time back
    assert bucket.reserve(12.0) == 0.0


def test_a_droppable_request_takes_only_a_free_slot_and_never_queues() -> None:
    bucket = TokenBucket(rate=10, burst=2, max_wait=60)
    assert bucket.take_now(0.0) and bucket.take_now(0.0)
    assert not bucket.take_now(0.0)  # none free: an Event is dropped, not queued
    assert bucket.reserve(0.0) == pytest.approx(0.1)  # a status write waits its turn
    assert not bucket.take_now(0.05)  # and is not overtaken by a later Event
    assert bucket.take_now(0.2)
    bucket.pause(now=1.0, seconds=1.0)
    assert not bucket.take_now(1.5) and bucket.take_now(2.0)


@pytest.mark.parametrize("rate, burst, max_wait", [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_settings_that_could_never_serve_are_refused(rate, burst, max_wait) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst, max_wait)
