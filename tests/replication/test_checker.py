"""The fault test's checker must catch every kind of damage it claims to (pure, no I/O)."""

from __future__ import annotations

from streamwal.node import records
from streamwal.proto import streaming_pb2 as pb
from tests.replication.checker import Acked, check, parse_log, payload


def record(term: int, bodies: list[bytes]) -> bytes:
    batch = pb.MessageBatch(messages=[pb.Message(payload=b) for b in bodies])
    return records.encode(term, 1000, len(bodies), batch.SerializeToString())


def tick(term: int) -> bytes:
    return records.encode(term, 2000, 1, b"", flags=records.FLAG_TIME_TICK)


GOOD = [
    (0, record(1, [payload("a", 0), payload("b", 0)])),
    (2, tick(1)),
    (3, record(2, [payload("a", 1), payload("b", 1), payload("a", 2)])),
]
ACKED = [Acked("a", 0, 0), Acked("b", 0, 1), Acked("a", 1, 3), Acked("b", 1, 4)]


def logs(*stored) -> dict:
    return {n + 1: parse_log(n + 1, s) for n, s in enumerate(stored)}


def test_identical_dense_logs_pass() -> None:
    verdict = check(logs(GOOD, GOOD, GOOD), ACKED, seen=[(0, payload("a", 0))])
    assert verdict.ok, verdict.summary()
    assert verdict.log_end == 6 and verdict.replicas == 3


def test_a_lost_acknowledged_message_fails() -> None:
    short = GOOD[:2]
    verdict = check(logs(GOOD, GOOD, short), ACKED)
    assert not verdict.ok
    assert any("ends differ" in p for p in verdict.problems)
    assert any("acknowledged b'a:1' at 3" in p for p in verdict.problems)


def test_gap_duplicate_disorder_and_divergence_are_reported() -> None:
    gap = [GOOD[0], GOOD[2]]
    assert any("not dense" in p for p in check(logs(gap), []).problems)
    dup = [*GOOD, (6, record(2, [payload("b", 1)]))]
    assert any("stored 2 times" in p for p in check(logs(dup), ACKED).problems)
    disorder = [(0, record(1, [payload("a", 1), payload("a", 0)]))]
    assert any("out of order" in p for p in check(logs(disorder), []).problems)
    other = [GOOD[0], GOOD[1], (3, record(3, [payload("c", 0), payload("b", 1), b"x"]))]
    assert any("offset 3" in p for p in check(logs(GOOD, other), []).problems)


def test_a_consumed_message_absent_afterwards_fails() -> None:
    verdict = check(logs(GOOD), [], seen=[(5, payload("z", 9))])
    assert any("consumer saw" in p for p in verdict.problems)
