"""The history checker catches every kind of damage it claims to (pure, no I/O)."""

from __future__ import annotations

from streamwal.node import records
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.history import Acked, check, parse_log, payload, read_log


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
ACKED = [Acked("a", 0, 0, 1), Acked("b", 0, 1, 1), Acked("a", 1, 3, 2), Acked("b", 1, 4, 2)]


def logs(*stored) -> dict:
    return {n + 1: parse_log(f"node {n + 1}", s) for n, s in enumerate(stored)}


def kinds(verdict) -> set[str]:
    return set(verdict.counts)


def test_identical_dense_logs_pass() -> None:
    verdict = check(logs(GOOD, GOOD, GOOD), ACKED, seen=[(0, payload("a", 0))])
    assert verdict.ok, verdict.summary()
    assert verdict.log_end == 6 and verdict.copies == 3
    assert verdict.read_back == 5 and verdict.unacknowledged == 1  # a:2 was never acked


def test_a_lost_acknowledged_message_fails() -> None:
    verdict = check(logs(GOOD, GOOD, GOOD[:2]), ACKED)
    assert kinds(verdict) == {"ends_differ", "lost"}
    assert verdict.counts["lost"] == 2  # a:1 and b:1, on the short copy
    assert any("acknowledged b'a:1' at 3" in p for p in verdict.problems)


def test_gap_duplicate_disorder_and_divergence_are_reported() -> None:
    gap = [GOOD[0], GOOD[2]]
    assert kinds(check(logs(gap), [])) == {"gap"}
    dup = [*GOOD, (6, record(2, [payload("b", 1)]))]
    assert kinds(check(logs(dup), ACKED)) == {"duplicate"}
    disorder = [(0, record(1, [payload("a", 1), payload("a", 0)]))]
    assert kinds(check(logs(disorder), [])) == {"out_of_order"}
    other = [GOOD[0], GOOD[1], (3, record(2, [payload("c", 0), payload("b", 1), b"x"]))]
    verdict = check(logs(GOOD, other), [])
    assert "divergent" in kinds(verdict) and any("offset 3" in p for p in verdict.problems)


def test_an_acknowledged_message_at_another_offset_is_moved_not_lost() -> None:
    verdict = check(logs(GOOD), [Acked("a", 1, 4)])
    assert kinds(verdict) == {"moved"}


def test_terms_going_back_and_appends_under_a_stale_term_fail() -> None:
    back = [(0, record(2, [payload("a", 0)])), (1, record(1, [payload("a", 1)]))]
    assert kinds(check(logs(back), [])) == {"term_regression"}
    # Term 1's owner acknowledged at 5, where term 2 wrote: a deposed owner's append.
    assert kinds(check(logs(GOOD), [Acked("z", 0, 5, 1)])) == {"stale_term", "lost"}
    # The message is there, but in a record of a later term than its acknowledgement.
    assert kinds(check(logs(GOOD), [Acked("a", 1, 3, 1)])) == {"stale_term"}
    # A resend answered by term 3's owner from a record of term 2 is fine.
    assert check(logs(GOOD), [Acked("a", 1, 3, 3)]).ok


def test_one_offset_acknowledged_twice_fails_even_when_the_log_looks_fine() -> None:
    twice = [Acked("a", 0, 0), Acked("z", 9, 0)]
    verdict = check(logs(GOOD), twice)
    assert "acked_twice" in kinds(verdict) and "lost" in kinds(verdict)
    assert "acked_twice" in kinds(check(logs(GOOD), [Acked("a", 0, 0), Acked("a", 0, 3)]))
    # The same acknowledgement recorded twice (a resend answered again) is fine.
    assert check(logs(GOOD), [Acked("a", 0, 0), Acked("a", 0, 0)]).ok


def test_a_consumed_message_absent_afterwards_fails() -> None:
    verdict = check(logs(GOOD), [], seen=[(5, payload("z", 9))])
    assert kinds(verdict) == {"phantom"}


def test_a_consumers_copy_skips_ticks_without_counting_gaps() -> None:
    consumed = read_log("consumer", [(o, b) for o, b in parse_log("x", GOOD).messages.items() if b])
    assert check([consumed], ACKED).ok
    assert check([parse_log("node 1", GOOD), consumed], ACKED).ok
    assert kinds(check([read_log("consumer", [(0, payload("a", 0))])], ACKED)) == {"lost"}


def test_verdicts_of_many_pchannels_merge() -> None:
    total = check(logs(GOOD), ACKED)
    total.merge(check(logs(GOOD[:2]), ACKED))
    assert total.acknowledged == 8 and total.counts["lost"] == 2 and not total.ok
