"""The node's txn rules without a node: keepalive expiry, limits, ownership, and what a
closed txn says; and how a committed txn's shared tick is stored and delivered."""

from __future__ import annotations

import pytest

from streamwal.client.consumed import ConsumedBatch
from streamwal.errors import (
    InvalidArgument,
    InvalidTransactionState,
    ResourceExhausted,
    TransactionExpired,
)
from streamwal.node import delivery, records
from streamwal.node.txn import TxnLimits, TxnTable
from streamwal.proto import streaming_pb2 as pb

STREAM, OTHER = object(), object()


def _table(**limits) -> TxnTable:
    return TxnTable(TxnLimits(**{"keepalive_s": 10.0, **limits}))


def test_append_renews_the_keepalive_and_silence_expires() -> None:
    t = _table()
    txn = t.begin(STREAM, "p", 1, "p_v", 2.0, now=0.0)
    t.append(STREAM, txn.txn_id, b"x", 1, now=1.5)
    t.append(STREAM, txn.txn_id, b"y", 1, now=3.0)  # 1.5 s after the last append: alive
    assert t.take(STREAM, txn.txn_id, 1, now=4.9).body == b"xy"
    late = t.begin(STREAM, "p", 1, "p_v", None, now=0.0)  # the node default: 10 s
    assert late.keepalive_s == 10.0
    with pytest.raises(TransactionExpired, match=rf"txn {late.txn_id} expired: no append"):
        t.take(STREAM, late.txn_id, 1, now=10.1)
    with pytest.raises(TransactionExpired):  # and it stays expired, with the same cause
        t.append(STREAM, late.txn_id, b"z", 1, now=10.2)
    assert len(t) == 0


def test_commit_and_rollback_close_a_txn_once() -> None:
    t = _table()
    a = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.append(STREAM, a.txn_id, b"x", 1, now=0)
    t.take(STREAM, a.txn_id, 1, now=0)
    with pytest.raises(InvalidTransactionState, match="closed \\(committed\\)"):
        t.take(STREAM, a.txn_id, 1, now=0)
    b = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.rollback(STREAM, b.txn_id, now=0)
    with pytest.raises(InvalidTransactionState, match="rolled back"):
        t.take(STREAM, b.txn_id, 1, now=0)
    with pytest.raises(InvalidTransactionState, match="unknown"):
        t.take(STREAM, 999, 1, now=0)
    empty = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    with pytest.raises(InvalidArgument, match="no messages"):
        t.take(STREAM, empty.txn_id, 1, now=0)


def test_a_txn_belongs_to_its_stream_and_term() -> None:
    t = _table()
    txn = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    with pytest.raises(InvalidTransactionState, match="unknown to this producer stream"):
        t.append(OTHER, txn.txn_id, b"x", 1, now=0)
    t.append(STREAM, txn.txn_id, b"x", 1, now=0)
    with pytest.raises(InvalidTransactionState, match="now at term 2: the txn is lost"):
        t.take(STREAM, txn.txn_id, 2, now=0)
    kept = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.begin(OTHER, "p", 1, "p_v", None, now=0)
    assert t.drop_owner(STREAM) == 1
    with pytest.raises(InvalidTransactionState, match="producer stream ended"):
        t.take(STREAM, kept.txn_id, 1, now=0)
    assert len(t) == 1


def test_every_ending_is_reported_once() -> None:
    outcomes: list[str] = []
    t = TxnTable(TxnLimits(keepalive_s=1.0), outcomes.append)
    done = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.append(STREAM, done.txn_id, b"x", 1, now=0)
    t.take(STREAM, done.txn_id, 1, now=0)
    t.rollback(STREAM, t.begin(STREAM, "p", 1, "p_v", None, now=0).txn_id, now=0)
    t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.begin(OTHER, "p", 1, "p_v", None, now=5)  # sweeps the expired one
    t.drop_owner(OTHER)
    assert outcomes == ["committed", "rolled_back", "expired", "lost"]


def test_limits() -> None:
    t = _table(max_bytes=10, max_open=2)
    a = t.begin(STREAM, "p", 1, "p_v", None, now=0)
    t.append(STREAM, a.txn_id, b"123456", 1, now=0)
    with pytest.raises(InvalidArgument, match="over the per-txn limit of 10"):
        t.append(STREAM, a.txn_id, b"123456", 1, now=0)
    assert t.take(STREAM, a.txn_id, 1, now=0).count == 1  # the refused append left no trace
    t.begin(STREAM, "p", 1, "p_v", 1.0, now=0)
    t.begin(STREAM, "p", 1, "p_v", 1.0, now=0)
    with pytest.raises(ResourceExhausted, match="--txn-max-open"):
        t.begin(STREAM, "p", 1, "p_v", None, now=0.5)
    t.begin(STREAM, "p", 1, "p_v", None, now=2.0)  # the expired ones were swept
    with pytest.raises(InvalidArgument, match="keepalive"):
        t.begin(STREAM, "p", 1, "p_v", -1, now=0)


def _txn_record(count: int, first_tick: int = 1000) -> records.Record:
    body = pb.MessageBatch(
        messages=[pb.Message(payload=b"t%d" % i) for i in range(count)]
    ).SerializeToString()
    value = records.encode(3, first_tick, count, body, records.FLAG_SHARED_TICK)
    return records.decode(value)


def test_a_committed_txn_record_shares_one_tick() -> None:
    rec = _txn_record(4)
    assert rec.last_tick == rec.first_tick == 1000
    assert [rec.tick_of(i) for i in range(4)] == [1000] * 4
    assert records.ticks_used(rec.flags, rec.count) == 1
    piece = delivery.select(50, rec, 50, delivery.Filters())
    assert piece is not None and (piece.first_offset, piece.count) == (50, 4)
    assert piece.runs() == [(1, 1000)] * 4  # dense offsets, one tick for all
    frame = delivery.batch_frame(piece, 3).consume_batch
    assert [(m.offset, m.time_tick) for m in ConsumedBatch(frame)] == [
        (50, 1000),
        (51, 1000),
        (52, 1000),
        (53, 1000),
    ]
    frames = delivery.message_frames(piece, 3)
    assert [f.consume.message.properties["_tt"] for f in frames] == ["1000"] * 4


def test_tick_filters_take_a_txn_whole_or_not_at_all() -> None:
    rec = _txn_record(4)
    assert delivery.select(0, rec, 0, delivery.Filters(min_tick=1000)) is not None
    assert delivery.select(0, rec, 0, delivery.Filters(min_tick=1001)) is None
    vch = delivery.select(0, rec, 0, delivery.Filters(min_tick=1000, vchannel="v"))
    assert vch is None  # none of the messages is on vchannel v
