"""Gray-failure bookkeeping without processes: failing writes logged once, quorum lease."""

from __future__ import annotations

from streamwal.node.health import SUMMARY_EVERY_S, WriteHealth, heard_at, quorum_contact


def test_a_failing_disk_is_logged_once_then_summarised_then_recovered() -> None:
    health = WriteHealth()
    assert health.reason(0.0) == ""
    assert health.failed(10.0, "No space left on device") == "first"
    assert [health.failed(10.0 + i / 100, "No space left on device") for i in range(500)] == [
        None
    ] * 500
    assert health.failed(10.0 + SUMMARY_EVERY_S, "No space left on device") == "summary"
    assert health.reason(12.5).startswith("WAL writes failing for 2.5s (502 failed)")
    assert health.succeeded() == (10.0, 502)
    assert health.succeeded() is None
    assert health.reason(30.0) == ""


def test_a_leader_needs_a_majority_heard_within_its_lease() -> None:
    # 3 replicas: the leader and one follower heard recently make a majority
    assert quorum_contact([9.5, 2.0], 3, now=10.0, lease=1.0)
    assert not quorum_contact([5.0, 2.0], 3, now=10.0, lease=1.0)
    # 5 replicas: two followers needed
    assert not quorum_contact([9.9, 1.0, 1.0, 1.0], 5, now=10.0, lease=1.0)
    assert quorum_contact([9.9, 9.1, 1.0, 1.0], 5, now=10.0, lease=1.0)
    # a single replica is its own majority
    assert quorum_contact([], 1, now=10.0, lease=1.0)


def test_a_follower_node_heard_counts_for_its_open_streams_only() -> None:
    # An idle pchannel's stream was last acked long ago; its node's heartbeat is recent.
    assert heard_at(2.0, 9.8, open_stream=True) == 9.8
    assert heard_at(2.0, 9.8, open_stream=False) == 2.0  # no stream: the node's word is moot
    assert heard_at(9.9, 2.0, open_stream=True) == 9.9
    assert heard_at(2.0, None, open_stream=True) == 2.0
