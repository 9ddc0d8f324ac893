"""Pure pieces of the accessor: grouping and per-message responses, the clock barrier."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamwal.client.append import (
    AppendResult,
    Message,
    gather_responses,
    group_by_vchannel,
)
from streamwal.errors import InvalidArgument
from streamwal.node.clock import BarrierTooFar, HybridClock, compose


def test_groups_keep_input_order_per_vchannel() -> None:
    msgs = [Message("a"), Message("b"), Message("a"), Message("c"), Message("b")]
    assert group_by_vchannel(msgs) == {"a": [0, 2], "b": [1, 4], "c": [3]}


def test_responses_come_back_in_input_order_with_group_errors_per_message() -> None:
    err = InvalidArgument("group b failed")
    outcomes = [
        ([0, 2], [AppendResult("a", 10, 100), AppendResult("a", 11, 101)]),
        ([1, 3], err),
    ]
    responses = gather_responses(4, outcomes)
    assert [r.result.message_id if r.result else None for r in responses.responses] == [
        10, None, 11, None,
    ]  # fmt: skip
    assert responses[1].error is err and responses[3].error is err
    assert responses.first_error() is err
    with pytest.raises(ValueError, match="belong to no group"):
        gather_responses(5, outcomes)


def test_reserved_property_keys_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="reserved"):
        Message("a", b"x", properties={"_tt": "1"}).entry()


def test_barrier_pushes_the_clock_past_it_but_not_far_into_the_future() -> None:
    now = 1_000_000
    clock = HybridClock(lambda: now)
    assert clock.allocate() == compose(now)
    barrier = compose(now + 500, 3)
    clock.push_past(barrier)
    assert clock.allocate(2) == barrier + 1
    assert clock.allocate() == barrier + 3
    with pytest.raises(BarrierTooFar):
        clock.push_past(compose(now + 61_000))
    assert clock.allocate() == barrier + 4  # the refused barrier changed nothing
    clock.push_past(compose(now - 10))  # a barrier in the past is already honoured
    assert clock.allocate() == barrier + 5


@pytest.mark.parametrize(
    "module",
    ["streamwal.client.node_client", "streamwal.client.wal", "streamwal.spark.discovery",
     "streamwal.client", "streamwal.client.aio"],
)  # fmt: skip
def test_client_modules_import_first_in_a_fresh_interpreter(module: str) -> None:
    """`streamwal.client` re-exports names lazily; no module may trip over that hook."""
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=60)


def test_streamwal_client_exports_what_aio_exports() -> None:
    import streamwal.client as sync_api
    from streamwal.client import aio

    assert set(aio.__all__) - {"connect"} == sync_api._EXPORTS
    assert sync_api.Message is aio.Message
    with pytest.raises(AttributeError):
        _ = sync_api.no_such_name
