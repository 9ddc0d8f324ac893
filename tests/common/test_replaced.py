"""Replaced connections linger for their calls, then close: a long outage leaks none."""

from __future__ import annotations

from streamwal.transport import Replaced


class Conn:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_a_replaced_connection_closes_once_older_than_its_linger() -> None:
    replaced = Replaced(linger=60.0, every=1.0)
    first, second, third = Conn(), Conn(), Conn()
    await replaced.retire(first, now=0.0)
    await replaced.retire(second, now=30.0)
    assert not first.closed and not second.closed  # calls may still run on them
    await replaced.retire(third, now=61.0)
    assert first.closed and not second.closed and not third.closed
    await replaced.close()
    assert second.closed and third.closed


def test_at_most_one_replacement_per_address_and_interval() -> None:
    replaced = Replaced(every=1.0)
    assert replaced.due("a", 10.0)
    assert not replaced.due("a", 10.5)
    assert replaced.due("b", 10.5)
    assert replaced.due("a", 11.0)
