"""Pure decision logic of the node: the hybrid clock and the term-fencing rules."""

from __future__ import annotations

import pytest

from streamwal.errors import (
    ChannelFenced,
    ChannelNotExist,
    DataLoss,
    IgnoredOperation,
    InvalidArgument,
    UnmatchedChannelTerm,
    is_fencing_error,
)
from streamwal.node.clock import LOGICAL_BITS, HybridClock, compose, physical_ms
from streamwal.node.fencing import (
    AssignOutcome,
    Fence,
    check_access,
    decide_assign,
    decide_damaged_assign,
    decide_remove,
)

# -- clock -------------------------------------------------------------------------------


def test_tick_layout_is_milvus_tso() -> None:
    tick = compose(1_700_000_000_123, 5)
    assert tick == (1_700_000_000_123 << 18) | 5
    assert physical_ms(tick) == 1_700_000_000_123
    assert LOGICAL_BITS == 18


def test_ticks_strictly_increase_within_one_millisecond() -> None:
    clock = HybridClock(now_ms=lambda: 1000)
    ticks = [clock.allocate() for _ in range(100)]
    assert ticks == list(range(compose(1000), compose(1000) + 100))
    assert clock.last == ticks[-1]


def test_ticks_follow_the_wall_clock_when_it_moves_on() -> None:
    now = [1000]
    clock = HybridClock(now_ms=lambda: now[0])
    first = clock.allocate()
    now[0] = 2000
    assert clock.allocate() == compose(2000)
    assert first == compose(1000)


def test_ticks_never_go_back_when_the_wall_clock_steps_back() -> None:
    now = [5000]
    clock = HybridClock(now_ms=lambda: now[0])
    a = clock.allocate()
    now[0] = 10  # NTP step backwards
    b = clock.allocate()
    c = clock.allocate()
    assert a < b < c
    assert b == a + 1


def test_allocate_reserves_a_range() -> None:
    clock = HybridClock(now_ms=lambda: 7)
    first = clock.allocate(10)
    assert first == compose(7)
    assert clock.last == first + 9
    assert clock.allocate(3) == first + 10
    assert clock.last == first + 12


def test_observe_moves_the_floor_up_never_down() -> None:
    clock = HybridClock(now_ms=lambda: 1)
    clock.observe(compose(50, 3))  # the last persisted tick of a previous run
    assert clock.allocate() == compose(50, 3) + 1
    clock.observe(compose(2))  # an older tick does not lower the floor
    assert clock.allocate() == compose(50, 3) + 2


def test_real_clock_is_close_to_wall_time() -> None:
    import time

    clock = HybridClock()
    tick = clock.allocate()
    assert abs(physical_ms(tick) - time.time() * 1000) < 5000


# -- fencing -----------------------------------------------------------------------------


def test_assign_new_pchannel_takes() -> None:
    assert decide_assign(None, 1) is AssignOutcome.TAKE


@pytest.mark.parametrize("term", [0, -1])
def test_assign_rejects_non_positive_terms(term: int) -> None:
    with pytest.raises(IgnoredOperation, match="term must be >= 1"):
        decide_assign(None, term)


def test_assign_higher_term_takes_serving_or_not() -> None:
    assert decide_assign(Fence(3, True), 4) is AssignOutcome.TAKE
    assert decide_assign(Fence(3, False), 9) is AssignOutcome.TAKE


def test_assign_same_term_is_idempotent_while_serving() -> None:
    assert decide_assign(Fence(3, True), 3) is AssignOutcome.ALREADY


def test_assign_same_term_after_release_is_ignored() -> None:
    with pytest.raises(IgnoredOperation, match="released"):
        decide_assign(Fence(3, False), 3)


def test_assign_lower_term_is_ignored() -> None:
    with pytest.raises(IgnoredOperation, match="term 3 already accepted") as info:
        decide_assign(Fence(3, True), 2)
    assert info.value.code == IgnoredOperation.code


def test_remove_unknown_or_released_is_channel_not_exist() -> None:
    with pytest.raises(ChannelNotExist):
        decide_remove(None, "p", 1)
    with pytest.raises(ChannelNotExist):
        decide_remove(Fence(2, False), "p", 2)


def test_remove_with_stale_term_is_ignored() -> None:
    with pytest.raises(IgnoredOperation, match="serving term 5"):
        decide_remove(Fence(5, True), "p", 4)


def test_remove_with_current_or_newer_term_is_allowed() -> None:
    decide_remove(Fence(5, True), "p", 5)
    decide_remove(Fence(5, True), "p", 6)


def test_access_rules() -> None:
    with pytest.raises(ChannelNotExist, match="never assigned"):
        check_access(None, "p", 1)
    with pytest.raises(ChannelFenced, match="moved away or was removed"):
        check_access(Fence(2, False), "p", 2)
    with pytest.raises(UnmatchedChannelTerm, match="stale"):
        check_access(Fence(2, True), "p", 1)
    with pytest.raises(UnmatchedChannelTerm, match="not assigned here"):
        check_access(Fence(2, True), "p", 3)
    check_access(Fence(2, True), "p", 2)
    taking = Fence(2, True, taking=3)  # term 3 is being taken: neither term is served
    with pytest.raises(UnmatchedChannelTerm, match="is taking term 3"):
        check_access(taking, "p", 2)
    with pytest.raises(UnmatchedChannelTerm, match="not served yet"):
        check_access(taking, "p", 3)


def test_fencing_errors_are_recognised() -> None:
    assert is_fencing_error(ChannelFenced("x"))
    assert is_fencing_error(ChannelNotExist("x"))
    assert is_fencing_error(UnmatchedChannelTerm("x"))
    assert not is_fencing_error(IgnoredOperation("x"))


TAKE, ALREADY = AssignOutcome.TAKE, AssignOutcome.ALREADY


@pytest.mark.parametrize(
    ("damage", "salvage", "following", "accept", "outcome", "expect"),
    [
        ("", False, False, False, TAKE, False),  # a whole log: nothing to decide
        ("lost 5..9", False, True, False, ALREADY, True),  # a follower cuts and copies again
        ("lost 5..9", False, False, False, TAKE, DataLoss),  # a single copy: refused
        ("lost 5..9", False, False, True, TAKE, True),  # ...unless the loss is accepted
        ("lost 5..9", False, False, True, ALREADY, InvalidArgument),  # under a new term
        ("lost 5..9", True, True, False, TAKE, DataLoss),  # a damaged table: salvage first
        ("lost 5..9", True, False, True, TAKE, DataLoss),
    ],
)
def test_a_damaged_log_is_never_led_as_it_is(damage, salvage, following, accept, outcome, expect):
    def decide() -> bool:
        return decide_damaged_assign("ch", damage, salvage, following, accept, outcome)

    if isinstance(expect, bool):
        assert decide() is expect
    else:
        with pytest.raises(expect):
            decide()
