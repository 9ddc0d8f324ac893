"""Pure: where a consumer starts (DeliverPolicy) and which messages pass (DeliverFilter)."""

from __future__ import annotations

import pytest
from google.protobuf.empty_pb2 import Empty

from streamwal.client.consumed import ConsumedBatch
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.errors import InvalidArgument
from streamwal.ids import decode_offset
from streamwal.node import delivery, records
from streamwal.node.delivery import Filters, select, start_offset
from streamwal.proto import streaming_pb2 as pb

# -- start_offset ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "first", "next_", "expected"),
    [
        (DeliverPolicy.all().to_proto(), 0, 10, 0),
        (DeliverPolicy.all().to_proto(), 4, 10, 4),  # retention moved the start
        (pb.DeliverPolicy(), 4, 10, 4),  # unset policy means all
        (DeliverPolicy.latest().to_proto(), 0, 10, 9),  # the latest message itself
        (DeliverPolicy.latest().to_proto(), 0, 0, 0),  # empty log: whatever comes next
        (DeliverPolicy.latest().to_proto(), 9, 10, 9),
        (DeliverPolicy.start_from(3).to_proto(), 0, 10, 3),
        (DeliverPolicy.start_from(10).to_proto(), 0, 10, 10),  # the next message to be appended
        (DeliverPolicy.start_from(1).to_proto(), 5, 10, 5),  # clamped to the oldest retained
        (DeliverPolicy.start_after(3).to_proto(), 0, 10, 4),
        (DeliverPolicy.start_after(9).to_proto(), 0, 10, 10),
        (DeliverPolicy.start_after(1).to_proto(), 5, 10, 5),  # clamped
    ],
)
def test_start_offset(policy, first: int, next_: int, expected: int) -> None:
    assert start_offset(policy, first, next_) == expected


def test_start_past_the_end_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="past the end"):
        start_offset(DeliverPolicy.start_from(11).to_proto(), 0, 10)
    with pytest.raises(InvalidArgument, match="past the end"):
        start_offset(DeliverPolicy.start_after(10).to_proto(), 0, 10)


@pytest.mark.parametrize("raw", [b"", b"\x00" * 7, b"\x00" * 9])
def test_malformed_message_id_is_invalid(raw: bytes) -> None:
    with pytest.raises(InvalidArgument, match="bad MessageID"):
        start_offset(pb.DeliverPolicy(start_from=pb.MessageID(id=raw)), 0, 10)


# -- filters -----------------------------------------------------------------------------


def test_filters_from_proto() -> None:
    assert Filters.from_proto([]) == Filters(0, None)
    assert Filters.from_proto([DeliverFilter.time_tick_gt(10).to_proto()]) == Filters(11, None)
    assert Filters.from_proto([DeliverFilter.time_tick_gte(10).to_proto()]) == Filters(10, None)
    both = [DeliverFilter.time_tick_gt(10).to_proto(), DeliverFilter.time_tick_gte(20).to_proto()]
    assert Filters.from_proto(both) == Filters(20, None)
    vc = [DeliverFilter.vchannel("p_v1").to_proto(), DeliverFilter.vchannel("p_v1").to_proto()]
    assert Filters.from_proto(vc) == Filters(0, "p_v1")


def test_two_different_vchannel_filters_are_invalid() -> None:
    with pytest.raises(InvalidArgument, match="at most one vchannel"):
        Filters.from_proto(
            [DeliverFilter.vchannel("a").to_proto(), DeliverFilter.vchannel("b").to_proto()]
        )


def test_empty_filter_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="empty DeliverFilter"):
        Filters.from_proto([pb.DeliverFilter()])


# -- select ------------------------------------------------------------------------------

BASE, TICK = 100, 5000


def _record(vchannels: list[str | None]) -> records.Record:
    batch = pb.MessageBatch()
    for i, vc in enumerate(vchannels):
        m = batch.messages.add(payload=f"m{i}".encode())
        if vc == "tick":
            m.properties["_t"] = "1200"
        elif vc is not None:
            m.properties["_vc"] = vc
    value = records.encode(3, TICK, len(vchannels), batch.SerializeToString())
    return records.decode(value)


def _payloads(s: delivery.Slice) -> list[bytes]:
    return [m.payload for m in pb.MessageBatch.FromString(s.body).messages]


def test_select_whole_record_shares_the_stored_bytes() -> None:
    rec = _record(["a", "b", "a"])
    s = select(BASE, rec, BASE, Filters())
    assert s is not None and s.body is rec.body
    assert (s.first_offset, s.first_tick, s.offsets, s.ticks) == (BASE, TICK, None, None)


def test_select_from_inside_a_record() -> None:
    s = select(BASE, _record(["a", "b", "a"]), BASE + 2, Filters())
    assert s is not None
    assert (s.first_offset, s.first_tick, _payloads(s)) == (BASE + 2, TICK + 2, [b"m2"])


def test_select_past_the_record_is_none() -> None:
    assert select(BASE, _record(["a", "b"]), BASE + 2, Filters()) is None


@pytest.mark.parametrize(
    ("flt", "first"),
    [
        (DeliverFilter.time_tick_gt(TICK).to_proto(), 1),
        (DeliverFilter.time_tick_gte(TICK).to_proto(), 0),
        (DeliverFilter.time_tick_gte(TICK + 2).to_proto(), 2),
        (DeliverFilter.time_tick_gt(TICK - 10).to_proto(), 0),
    ],
)
def test_select_time_tick_filters(flt, first: int) -> None:
    s = select(BASE, _record(["a", "b", "a"]), BASE, Filters.from_proto([flt]))
    assert s is not None
    assert s.first_offset == BASE + first and s.first_tick == TICK + first
    assert _payloads(s) == [f"m{i}".encode() for i in range(first, 3)]


def test_select_time_tick_filter_past_the_record_is_none() -> None:
    f = Filters.from_proto([DeliverFilter.time_tick_gt(TICK + 2).to_proto()])
    assert select(BASE, _record(["a", "b", "a"]), BASE, f) is None


def test_select_vchannel_keeps_its_messages_and_time_ticks() -> None:
    rec = _record(["a", "b", "tick", None, "a", "b"])
    s = select(BASE, rec, BASE, Filters(vchannel="a"))
    assert s is not None
    assert s.offsets == [BASE, BASE + 2, BASE + 4]
    assert s.ticks == [TICK, TICK + 2, TICK + 4]
    assert _payloads(s) == [b"m0", b"m2", b"m4"]


def test_select_vchannel_and_tick_and_position_combine() -> None:
    rec = _record(["a", "b", "a", "a", "b", "a"])
    f = Filters.from_proto(
        [DeliverFilter.vchannel("a").to_proto(), DeliverFilter.time_tick_gte(TICK + 3).to_proto()]
    )
    s = select(BASE, rec, BASE + 1, f)
    assert s is not None and s.offsets == [BASE + 3, BASE + 5]
    s = select(BASE, rec, BASE + 4, Filters(vchannel="a"))
    assert s is not None and s.offsets == [BASE + 5]


def test_select_vchannel_without_a_match_is_none() -> None:
    assert select(BASE, _record(["b", None]), BASE, Filters(vchannel="a")) is None


def test_frames_carry_offsets_ticks_and_term() -> None:
    rec = _record(["a", "b", "a"])
    s = select(BASE, rec, BASE, Filters(vchannel="a"))
    assert s is not None
    frame = delivery.batch_frame(s, 3).consume_batch
    assert decode_offset(frame.first_id.id) == BASE and frame.term == 3
    assert list(frame.offsets) == [BASE, BASE + 2] and list(frame.time_ticks) == [TICK, TICK + 2]
    singles = delivery.message_frames(s, 3)
    assert [decode_offset(f.consume.id.id) for f in singles] == [BASE, BASE + 2]
    assert [f.consume.message.properties["_tt"] for f in singles] == [str(TICK), str(TICK + 2)]
    assert all(f.consume.message.properties["_wt"] == "3" for f in singles)
    assert singles[0].consume.message.properties["_vc"] == "a"
    dense = delivery.message_frames(select(BASE, rec, BASE + 1, Filters()), 4)
    assert [decode_offset(f.consume.id.id) for f in dense] == [BASE + 1, BASE + 2]
    assert dense[1].consume.message.properties["_tt"] == str(TICK + 2)


def test_policies_and_filters_become_the_protocol_messages() -> None:
    assert DeliverPolicy.all().to_proto().WhichOneof("policy") == "all"
    assert DeliverPolicy.latest().to_proto() == pb.DeliverPolicy(latest=Empty())
    assert decode_offset(DeliverPolicy.start_after(7).to_proto().start_after.id) == 7
    assert decode_offset(DeliverPolicy.start_from(9).to_proto().start_from.id) == 9
    assert DeliverFilter.time_tick_gt(5).to_proto().time_tick_gt.time_tick == 5
    assert DeliverFilter.time_tick_gte(6).to_proto().time_tick_gte.time_tick == 6
    assert DeliverFilter.vchannel("v").to_proto().vchannel.vchannel == "v"


def _body(*payloads: bytes) -> bytes:
    return pb.MessageBatch(messages=[pb.Message(payload=p) for p in payloads]).SerializeToString()


def test_filtered_slices_join_into_one_frame_with_each_message_position() -> None:
    joined = delivery.join(
        [
            delivery.Slice(10, 1000, _body(b"a"), 1),
            delivery.Slice(11, 2000, _body(b"b", b"c"), 2),
            delivery.Slice(13, 3000, _body(b"d"), 1, [13], [3000]),
        ]
    )
    messages = pb.MessageBatch.FromString(joined.body).messages
    assert [m.payload for m in messages] == [b"a", b"b", b"c", b"d"]
    assert joined.count == 4
    assert joined.offsets == [10, 11, 12, 13]
    assert joined.ticks == [1000, 2000, 2001, 3000]
    assert delivery.joinable([joined], delivery.Slice(14, 1, _body(b"e"), 1))
    assert not delivery.joinable([joined], delivery.Slice(14, 1, b"x" * delivery.JOIN_BYTES, 1))


def test_dense_slices_join_with_tick_runs_and_the_client_decodes_every_position() -> None:
    joined = delivery.join(
        [
            delivery.Slice(10, 1000, _body(b"a"), 1),
            delivery.Slice(11, 2000, _body(b"b", b"c"), 2),
            delivery.Slice(13, 3000, _body(b"d", b"e", b"f"), 3),
        ]
    )
    assert joined.offsets is None and joined.count == 6
    assert joined.tick_runs == [(1, 1000), (2, 2000), (3, 3000)]
    frame = delivery.batch_frame(joined, 5).consume_batch
    assert not frame.offsets and not frame.time_ticks  # nothing per message on the wire
    got = ConsumedBatch(frame)
    assert [(m.offset, m.time_tick, m.payload, m.term) for m in got] == [
        (10, 1000, b"a", 5),
        (11, 2000, b"b", 5),
        (12, 2001, b"c", 5),
        (13, 3000, b"d", 5),
        (14, 3001, b"e", 5),
        (15, 3002, b"f", 5),
    ]
    singles = delivery.message_frames(joined, 5)
    assert [f.consume.message.properties["_tt"] for f in singles] == [
        "1000", "2000", "2001", "3000", "3001", "3002"
    ]  # fmt: skip
    # a gap between slices (a retention cut, a skipped TimeTick record) is not dense
    gap = delivery.join(
        [delivery.Slice(10, 1000, _body(b"a"), 1), delivery.Slice(12, 1, _body(b"b"), 1)]
    )
    assert gap.offsets == [10, 12] and gap.ticks == [1000, 1]
    got = ConsumedBatch(delivery.batch_frame(gap, 1).consume_batch)
    assert [(m.offset, m.time_tick) for m in got] == [(10, 1000), (12, 1)]


def test_a_consumed_batch_gives_columns_equal_to_its_messages() -> None:
    """The columns a bulk reader uses say the same as the messages, in every frame shape:
    dense with tick runs, dense with one run, explicit offsets."""
    dense = delivery.join(
        [delivery.Slice(10, 1000, _body(b"a"), 1), delivery.Slice(11, 2000, _body(b"b", b"c"), 2)]
    )
    one_run = delivery.Slice(20, 500, _body(b"x", b"y"), 2)
    gap = delivery.join(
        [delivery.Slice(30, 1000, _body(b"p"), 1), delivery.Slice(32, 1, _body(b"q"), 1)]
    )
    for piece in (dense, one_run, gap):
        batch = ConsumedBatch(delivery.batch_frame(piece, 3).consume_batch)
        assert batch.payloads == [m.payload for m in batch]
        assert batch.offsets == [m.offset for m in batch]
        assert batch.time_ticks == [m.time_tick for m in batch]
        assert len(batch) == len(batch.payloads) and batch[-1].offset == batch.offsets[-1]
        assert isinstance(batch[1:], list) and batch[1:][0] is batch[1]  # made once
    assert ConsumedBatch(delivery.batch_frame(one_run, 3).consume_batch).time_ticks == [500, 501]
    assert repr(ConsumedBatch(delivery.batch_frame(gap, 3).consume_batch)) == (
        "ConsumedBatch(2 messages, offsets 30..32)"
    )
