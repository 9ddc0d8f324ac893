"""Consumer-group cursors without a node: the table, its snapshot encoding, and what a
consume takes from a run of records."""

from __future__ import annotations

import pytest

from streamwal.errors import ConsumerGroupExist, ConsumerGroupNotExist, InvalidArgument
from streamwal.node import records
from streamwal.node.cursors import (
    DEFAULT_SESSION_S,
    MAX_CLAIMS,
    MAX_GROUPS,
    MAX_PENDING,
    Claim,
    CursorTable,
    take,
)
from streamwal.node.records import CorruptRecord
from streamwal.proto import streaming_pb2 as pb


def test_table_create_destroy_and_snapshot_round_trip() -> None:
    t = CursorTable()
    t.create("p", "g", 5)
    t.create("p", "ünï cødé", 7)
    with pytest.raises(ConsumerGroupExist):
        t.create("p", "g", 0)
    with pytest.raises(InvalidArgument):
        t.create("p", "", 0)
    with pytest.raises(ConsumerGroupNotExist, match="'x' does not exist on pchannel 'p'"):
        t.get("p", "x")
    t.cursors["g"] = 2**40
    assert CursorTable.decode(t.encode()).cursors == {"g": 2**40, "ünï cødé": 7}
    t.destroy("p", "g")
    with pytest.raises(ConsumerGroupNotExist):
        t.destroy("p", "g")
    assert CursorTable.decode(CursorTable().encode()).cursors == {}
    with pytest.raises(CorruptRecord):
        CursorTable.decode(b"\x01\x00\x05ab")


def test_claims_answer_a_retry_survive_the_snapshot_and_stay_bounded() -> None:
    t = CursorTable()
    t.create("p", "g", 0)
    t.record_claim("g", "c1", Claim(1, 0, 10))
    t.record_claim("g", "c2", Claim(7, 10, 12))
    t.record_claim("g", "", Claim(1, 12, 13))  # an anonymous consumer keeps nothing
    assert t.claimed("g", "c1", 1) == Claim(1, 0, 10)
    assert t.claimed("g", "c1", 2) is None  # a new call, not a retry
    assert t.claimed("g", "", 1) is None and t.claimed("other", "c1", 1) is None
    back = CursorTable.decode(t.encode())
    assert back == t and back.claimed("g", "c2", 7) == Claim(7, 10, 12)
    t.record_claim("g", "c1", Claim(2, 12, 20))  # c1's next call replaces its last
    assert t.claimed("g", "c1", 1) is None and t.claimed("g", "c1", 2) == Claim(2, 12, 20)
    for i in range(MAX_CLAIMS):
        t.record_claim("g", f"x{i}", Claim(1, 0, 1))
    assert len(t.claims["g"]) == MAX_CLAIMS and "c2" not in t.claims["g"]  # oldest first
    t.destroy("p", "g")
    assert "g" not in t.claims
    # A snapshot written before claims existed (version 1) still loads.
    assert CursorTable.decode(b"\x01\x00\x01g" + (5).to_bytes(8, "big")).cursors == {"g": 5}


def test_group_count_is_bounded() -> None:
    t = CursorTable({f"g{i}": 0 for i in range(MAX_GROUPS)})
    with pytest.raises(InvalidArgument, match="limit"):
        t.create("p", "one-more", 0)


def _rec(count: int, flags: int = 0, term: int = 1) -> records.Record:
    body = pb.MessageBatch(messages=[pb.Message(payload=b"m")] * count).SerializeToString()
    return records.decode(records.encode(term, 100, count, body, flags))


def _log() -> list[tuple[int, records.Record]]:
    """offsets 0-9 data, 10 a cursor record, 11 a TimeTick, 12-15 a txn, 16-17 data (term 2)."""
    return [
        (0, _rec(10)),
        (10, records.decode(records.encode(1, 200, 1, b"\x01", records.FLAG_CURSORS))),
        (11, _rec(1, records.FLAG_TIME_TICK)),
        (12, _rec(4, records.FLAG_SHARED_TICK)),
        (16, _rec(2, term=2)),
    ]


def _offsets(pieces) -> list[int]:
    out: list[int] = []
    for _, p in pieces:
        out += p.offsets or range(p.first_offset, p.first_offset + p.count)
    return out


def test_take_splits_plain_records_and_skips_internal_ones() -> None:
    pieces, cursor, taken = take(_log(), 0, 4)
    assert (_offsets(pieces), cursor, taken) == ([0, 1, 2, 3], 4, 4)
    pieces, cursor, taken = take(_log(), 4, 6)
    # The rest of the record, then the cursor moves over the cursor record and the tick.
    assert (_offsets(pieces), cursor, taken) == ([4, 5, 6, 7, 8, 9], 12, 6)


def test_take_never_splits_a_txn() -> None:
    pieces, cursor, _ = take(_log(), 8, 4)  # 8, 9 fit; the 4-message txn does not
    assert (_offsets(pieces), cursor) == ([8, 9], 12)
    pieces, cursor, _ = take(_log(), 12, 1)  # first in line: the txn comes whole
    assert (_offsets(pieces), cursor) == ([12, 13, 14, 15], 16)
    pieces, cursor, taken = take(_log(), 12, 100)
    assert [t for t, _ in pieces] == [1, 2]  # each piece keeps its record's term
    assert (_offsets(pieces), cursor, taken) == ([12, 13, 14, 15, 16, 17], 18, 6)


def test_take_at_the_end_or_before_retention() -> None:
    assert take(_log(), 18, 5) == ([], 18, 0)
    pieces, cursor, _ = take(_log()[3:], 0, 2)  # the cursor fell below the oldest record
    assert (_offsets(pieces), cursor) == ([12, 13, 14, 15], 16)


def test_at_least_once_pending_commit_expiry_and_redelivery() -> None:
    t = CursorTable()
    t.create("p", "g", 0)
    t.touch("g", "a", now=0.0, session_s=3.0)
    t.touch("g", "b", now=0.0, session_s=3.0)
    t.hold("g", "a", (0, 10))
    t.hold("g", "a", (10, 15))  # adjacent: one range
    t.hold("g", "b", (15, 20))
    t.cursors["g"] = 20
    assert t.pending["g"]["a"] == [(0, 15)] and t.committed("g") == 0
    assert t.commit("g", "a", 9) == 1 and t.pending["g"]["a"] == [(10, 15)]
    assert t.committed("g") == 10
    # The snapshot keeps pending ranges (not the session clock); v2 snapshots still load.
    back = CursorTable.decode(t.encode())
    assert back.pending == t.pending and back.cursors == t.cursors and not back.seen
    # a is silent past its session, b is not: a's range becomes an orphan.
    t.touch("g", "b", now=2.5, session_s=3.0)
    assert t.expire("g", now=3.5) == ["a"]
    assert t.next_orphan("g") == (10, 15) and "a" not in t.members("g")
    assert t.committed("g") == 10  # an orphan is not processed yet
    t.settle_orphan("g", (10, 12))  # handed out in part
    assert t.orphans("g") == [(12, 15)]
    t.settle_orphan("g", (12, 15))
    assert t.next_orphan("g") is None
    t.commit("g", "b", 19)
    assert t.committed("g") == 20
    # Leaving orphans at once; a consumer holding MAX_PENDING ranges must commit first.
    t.hold("g", "b", (30, 31))
    t.orphan("g", "b")
    assert t.orphans("g") == [(30, 31)]
    for i in range(MAX_PENDING):
        t.hold("g", "c", (100 + 2 * i, 101 + 2 * i))
    with pytest.raises(InvalidArgument, match="commit before consuming more"):
        t.check_room("p", "g", "c")
    # After a load a pending consumer starts a fresh session (a move is no silence).
    loaded = CursorTable.decode(t.encode())
    assert loaded.expire("g", now=1000.0) == []
    assert loaded.expire("g", now=1000.0 + DEFAULT_SESSION_S + 1) == ["c"]
