"""Pure: the on-disk record format (checksum, truncation) and the retention planner."""

from __future__ import annotations

import pytest

from streamwal.node import records
from streamwal.node.clock import compose
from streamwal.node.records import CorruptRecord
from streamwal.node.retention import plan_cut
from streamwal.proto import streaming_pb2 as pb

BODY = pb.MessageBatch(
    messages=[pb.Message(payload=b"x" * 40, properties={"_vc": "p_v1", "k": "v"})] * 3
).SerializeToString()


def test_round_trip_keeps_every_field() -> None:
    value = records.encode(7, 123456789, 3, BODY)
    rec = records.decode(value, "p@0")
    assert (rec.term, rec.first_tick, rec.count, rec.body) == (7, 123456789, 3, BODY)
    assert rec.last_tick == 123456791
    assert records.peek(value) == (7, 123456789, 3)
    assert len(value) == records.HEADER_SIZE + len(BODY)


# Records as the node wrote them when the CRC was zlib's (node/records.py): what is on
# disk must read the same, and a record must encode to the same bytes.
STORED = [
    (
        "01020000c7ec55bd00000000000000070000000000000063000000010270310000000000000005616263",
        (7, 99, 1, b"abc", 0, ("p1", 5)),
    ),
    ("010400004a89d4730000000000000003000000000000000a00000002", (3, 10, 2, b"", 4, None)),
]


@pytest.mark.parametrize(("stored", "fields"), STORED)
def test_records_already_stored_read_and_encode_as_before(stored: str, fields: tuple) -> None:
    term, tick, count, body, flags, producer = fields
    rec = records.decode(bytes.fromhex(stored), "p@0")
    assert rec.producer == producer and rec.body == body
    assert (rec.term, rec.first_tick, rec.count, rec.flags & ~records.FLAG_PRODUCER) == (
        term,
        tick,
        count,
        flags,
    )
    assert records.encode(term, tick, count, body, flags, producer).hex() == stored


def test_round_trip_of_an_empty_body() -> None:
    rec = records.decode(records.encode(1, 1, 0, b""))
    assert rec.body == b"" and rec.count == 0


@pytest.mark.parametrize("position", [4, 8, 12, 16, 24, records.HEADER_SIZE, -1])
def test_crc_detects_a_flipped_bit_anywhere(position: int) -> None:
    value = bytearray(records.encode(7, 123456789, 3, BODY))
    value[position] ^= 0x01  # crc itself, term, tick, count, body start, body end
    with pytest.raises(CorruptRecord, match="checksum"):
        records.decode(bytes(value), "p@0")


def test_every_single_bit_flip_in_header_fields_and_body_is_detected() -> None:
    value = records.encode(2, 99, 3, BODY)
    for i in range(4, len(value)):  # byte 0..3 are version, flags, reserved
        for bit in (0, 7):
            bad = bytearray(value)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptRecord):
                records.decode(bytes(bad))


def test_truncated_header_is_corrupt() -> None:
    value = records.encode(7, 1, 3, BODY)
    with pytest.raises(CorruptRecord, match="truncated"):
        records.decode(value[: records.HEADER_SIZE - 1], "p@5")


def test_truncated_body_is_corrupt() -> None:
    value = records.encode(7, 1, 3, BODY)
    with pytest.raises(CorruptRecord, match="checksum"):
        records.decode(value[:-1], "p@5")


def test_unknown_version_is_corrupt() -> None:
    value = bytearray(records.encode(7, 1, 3, BODY))
    value[0] = 99
    with pytest.raises(CorruptRecord, match="unknown version 99"):
        records.decode(bytes(value))


def test_corrupt_record_is_an_inner_streaming_error() -> None:
    from streamwal.errors import Code

    with pytest.raises(CorruptRecord) as info:
        records.decode(b"\x01")
    assert info.value.code == Code.STREAMING_CODE_INNER


# -- retention ---------------------------------------------------------------------------

MS = 1_000_000


def headers(*spec: tuple[int, int, int]) -> list[tuple[int, int, int, int]]:
    """(count, physical ms, size) per record -> (base, first tick, count, size)."""
    out, base = [], 0
    for count, ms, size in spec:
        out.append((base, compose(ms), count, size))
        base += count
    return out


def test_nothing_due_without_bounds() -> None:
    h = headers((10, MS, 100), (10, MS + 1, 100))
    assert plan_cut(h, now_ms=MS * 10, total_bytes=200) is None


def test_size_bound_drops_oldest_whole_records() -> None:
    h = headers((10, MS, 100), (5, MS, 100), (7, MS, 100), (1, MS, 100))
    # 400 bytes, keep <= 250: drop the first two records (200 freed).
    assert plan_cut(h, now_ms=MS, total_bytes=400, max_bytes=250) == (15, 200)


def test_size_bound_exactly_met_drops_nothing() -> None:
    h = headers((10, MS, 100), (5, MS, 100))
    assert plan_cut(h, now_ms=MS, total_bytes=200, max_bytes=200) is None


def test_the_newest_record_is_always_kept() -> None:
    h = headers((10, MS, 100), (5, MS, 100))
    assert plan_cut(h, now_ms=MS, total_bytes=200, max_bytes=1) == (10, 100)
    one = headers((10, MS, 100))
    assert plan_cut(one, now_ms=MS * 9, total_bytes=100, max_bytes=1, max_age_ms=1) is None
    assert plan_cut([], now_ms=MS, total_bytes=0, max_bytes=1) is None


def test_age_bound_uses_the_last_tick_of_a_record() -> None:
    # Record 0 ends at MS, record 1 at MS+500, record 2 is new.
    h = headers((1, MS, 10), (1, MS + 500, 10), (1, MS + 2000, 10))
    now = MS + 2000
    assert plan_cut(h, now_ms=now, total_bytes=30, max_age_ms=1600) == (1, 10)
    assert plan_cut(h, now_ms=now, total_bytes=30, max_age_ms=1000) == (2, 20)
    assert plan_cut(h, now_ms=now, total_bytes=30, max_age_ms=5000) is None


def test_age_and_size_bounds_combine_as_either() -> None:
    h = headers((1, MS, 10), (1, MS + 1900, 10), (1, MS + 1950, 10), (1, MS + 2000, 10))
    # age drops record 0 only, size (<= 15) wants 3 dropped: the larger cut wins
    assert plan_cut(h, now_ms=MS + 2000, total_bytes=40, max_age_ms=1000, max_bytes=15) == (
        3,
        30,
    )


def test_cut_stops_at_the_first_record_to_keep() -> None:
    # Not due: the first record is young, even though a later one is old (clock skew).
    h = headers((1, MS + 5000, 10), (1, MS, 10), (1, MS + 5000, 10))
    assert plan_cut(h, now_ms=MS + 5000, total_bytes=30, max_age_ms=1000) is None


def test_a_flipped_flag_bit_is_detected() -> None:
    value = bytearray(records.encode(7, 123456789, 3, BODY))
    value[1] ^= records.FLAG_TIME_TICK
    with pytest.raises(CorruptRecord):
        records.decode(bytes(value))
