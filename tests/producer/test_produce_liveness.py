"""When a producer's stream counts as dead, alone: a clock given by hand, no node."""

from __future__ import annotations

import pytest

from streamwal.client.produce_liveness import PING, Bounds, Dead, Liveness

B = Bounds(request_timeout=10, keepalive_interval=5, keepalive_timeout=2)

# Each step: (now, heard at `now` first?, oldest request on the wire sent at, expected).
# "dead:<word>" expects Dead whose reason names <word>.
CASES = {
    "quiet and answering: a ping each interval, never dead": [
        (4.9, False, None, None), (5.0, False, None, PING), (5.5, True, None, None),
        (10.4, False, None, None), (10.5, False, None, PING), (11.0, True, None, None),
    ],
    "quiet, the ping unanswered: dead after keepalive_timeout": [
        (5.0, False, None, PING), (6.0, False, None, None), (7.0, False, None, None),
        (7.1, False, None, "dead:keepalive"),
    ],
    "anything heard after the ping answers it": [
        (5.0, False, None, PING), (6.9, True, None, None), (9.0, False, None, None),
    ],
    "busy: the oldest request is the probe, no pings": [
        (5.0, False, 1.0, None), (9.0, False, 1.0, None), (10.9, False, 1.0, None),
        (11.1, False, 1.0, "dead:request_timeout"),
    ],
    "busy with answers flowing: the oldest keeps moving": [
        (6.0, True, 1.0, None), (12.0, True, 5.0, None), (18.0, True, 11.0, None),
    ],
    "a ping out, then a request: the request's bound takes over": [
        (5.0, False, None, PING), (8.0, False, 7.5, None), (17.0, False, 7.5, None),
        (17.6, False, 7.5, "dead:request_timeout"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
def test_liveness(steps) -> None:
    live = Liveness(B, now=0.0, can_ping=True)
    for now, heard, oldest, expected in steps:
        if heard:
            live.heard(now)
        got = live.check(now, oldest)
        if isinstance(expected, str) and expected.startswith("dead:"):
            assert isinstance(got, Dead) and expected[5:] in got.reason, (now, got)
        else:
            assert got == expected, (now, got)


def test_a_node_that_cannot_answer_pings_is_bounded_only_while_busy() -> None:
    live = Liveness(B, now=0.0, can_ping=False)
    assert live.check(1000.0, None) is None
    assert isinstance(live.check(1000.0, 989.0), Dead)


@pytest.mark.parametrize("field", ["request_timeout", "keepalive_interval", "keepalive_timeout"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_bounds_must_be_positive(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Bounds(**{field: value})


def test_the_tick_notices_each_bound_in_time() -> None:
    assert B.tick == 0.5 and Bounds().tick == 1.25
