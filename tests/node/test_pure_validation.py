"""The edge's checks (node/validation.py) without a node: table-driven.

A batch is refused exactly when protobuf reads a bad `_t` in it, however the bytes lay
the map entry out (a crafted client's value-first, repeated-value or overlong-length
entries included)."""

from __future__ import annotations

import pytest

from streamwal.client import encoding
from streamwal.errors import InvalidArgument
from streamwal.node import validation
from streamwal.proto import streaming_pb2 as pb
from streamwal.protowire import varint


def _entry(*fields: bytes) -> bytes:
    """A Message with one raw properties map entry made of `fields` (as a crafted client
    could write it), as a MessageBatch element."""
    entry = b"".join(fields)
    message = b"\x12" + varint(len(entry)) + entry
    return b"\n" + varint(len(message)) + message


KEY = b"\n\x02_t"


def _value(text: bytes) -> bytes:
    return b"\x12" + varint(len(text)) + text


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (encoding.encode_entry(b"x"), False),
        (encoding.encode_entry(b"_t in the payload is no property"), False),
        (encoding.encode_entry(b"x", encoding.encode_properties({"_t": "400"})), False),
        (encoding.encode_entry(b"x", encoding.encode_properties({"_t": ""})), False),
        (encoding.encode_entry(b"x", encoding.encode_properties({"_t": "abc"})), True),
        (encoding.encode_entry(b"x", encoding.encode_properties({"_t": "2147483648"})), True),
        (_entry(KEY, _value(b"400")), False),
        (_entry(_value(b"abc"), KEY), True),  # the value before the key
        (_entry(KEY, _value(b"400"), _value(b"abc")), True),  # a second value wins
        # An entry with an unknown field: protobuf (upb) does not show it, so no reader
        # here sees a `_t` in it (kept verbatim; docs/decisions-edge.md).
        (_entry(b"\x1a\x02\x12\x08", KEY, _value(b"12"), _value(b"abc")), False),
        (_entry(b"\n\x82\x00_t", _value(b"abc")), True),  # an overlong key length
        (_entry(b"\n\x82\x80\x80\x00_t", _value(b"abc")), True),  # ... longer still
        (_entry(b"\x8a\x00\x02_t", _value(b"abc")), True),  # an overlong key tag
        (_entry(KEY), False),  # no value: empty, which means Insert
        (
            encoding.encode_entry(b"a", encoding.encode_properties({"_t": "1200"}))
            + encoding.encode_entry(b"b", encoding.encode_properties({"_t": "-1"})),
            True,
        ),
    ],
    ids=[
        "no-properties",
        "payload-only",
        "good",
        "empty",
        "letters",
        "over-int32",
        "raw-good",
        "value-first",
        "second-value",
        "unknown-field",
        "overlong-key",
        "overlong-key-4",
        "overlong-tag",
        "no-value",
        "second-message",
    ],
)
def test_a_batch_with_a_bad_type_is_refused_however_it_is_encoded(
    body: bytes, refused: bool
) -> None:
    parsed = pb.MessageBatch.FromString(body)  # as every reader here reads it
    assert (
        any(not validation.is_msg_type(m.properties.get("_t")) for m in parsed.messages) == refused
    )
    if any("_t" in m.properties for m in parsed.messages):
        assert validation.may_hold_type(body)  # the pre-filter misses no `_t` key
    if refused:
        with pytest.raises(InvalidArgument, match="property _t is"):
            validation.batch(body, 1 << 20)
    else:
        assert len(validation.batch(body, 1 << 20).messages) == len(parsed.messages)


@pytest.mark.parametrize("payload", [b"_tx", b"x_t", b"\x12_t_t", b"\x01_t", b"\x03_t"], ids=repr)
def test_a_payload_holding_underscore_t_is_not_taken_for_a_type_key(payload: bytes) -> None:
    """The bytes `_t` after anything but a length of 2: no batch walk (random payloads
    hold `_t` in most 64 KB batches)."""
    assert not validation.may_hold_type(encoding.encode_entry(payload))


@pytest.mark.parametrize(
    ("code", "ok"),
    [
        (None, True),
        ("", True),
        ("0", True),
        ("400", True),
        ("007", True),
        ("2147483647", True),
        ("2147483648", False),
        ("12345678901", False),
        ("-1", False),
        ("4.0", False),
        (" 400", False),
        ("\u0663", False),  # a digit, but not ASCII
        ("abc", False),
    ],
)
def test_msg_type_codes(code: str | None, ok: bool) -> None:
    assert validation.is_msg_type(code) == ok


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"min_next_offset": 2**62 + 1}, "min_next_offset must be 0.."),
        ({"catch_up_from": "nohost"}, "catch_up_from must be HOST:PORT"),
        ({"catch_up_from": "h:0"}, "catch_up_from must be HOST:PORT"),
        ({"catch_up_from": "h:65536"}, "catch_up_from must be HOST:PORT"),
        (
            {"replica_set": pb.ReplicaSet(members=[pb.StreamingNodeInfo(address="h:1")] * 10)},
            "at most 9",
        ),
        (
            {"replica_set": pb.ReplicaSet(members=[pb.StreamingNodeInfo(address="bad")])},
            "replica_set.members[0].address",
        ),
    ],
)
def test_assign_ranges(change: dict, text: str) -> None:
    req = pb.StreamingNodeManagerAssignRequest(pchannel=pb.PChannelInfo(name="p", term=1))
    validation.assign(req)
    for field, value in change.items():
        if isinstance(value, pb.ReplicaSet):
            getattr(req, field).CopyFrom(value)
        else:
            setattr(req, field, value)
    with pytest.raises(InvalidArgument) as info:
        validation.assign(req)
    assert text in str(info.value)


def test_a_start_at_the_largest_offset_allowed_is_taken() -> None:
    req = pb.StreamingNodeManagerAssignRequest(
        pchannel=pb.PChannelInfo(name="p", term=1), min_next_offset=2**62, catch_up_from="[::1]:5"
    )
    validation.assign(req)


def test_txn_keepalive_bound() -> None:
    validation.txn_begin(pb.TxnBegin(keepalive_ms=600_000), 600_000)
    with pytest.raises(InvalidArgument, match="--txn-max-keepalive"):
        validation.txn_begin(pb.TxnBegin(keepalive_ms=2**64 - 1), 600_000)


@pytest.mark.parametrize("code, refused", [("abc", True), ("1", False)])
def test_a_batch_of_large_messages_is_walked_not_scanned(code: str, refused: bool) -> None:
    """Over SCAN_MAX_BYTES_PER_MESSAGE a message on average, the properties are read
    without the byte scan: a bad `_t` is refused all the same."""
    big = pb.Message(payload=b"x" * 4096)
    typed = pb.Message(payload=b"y" * 4096, properties={"_t": code})
    body = pb.MessageBatch(messages=[big, big, typed]).SerializeToString()
    assert len(body) > validation.SCAN_MAX_BYTES_PER_MESSAGE * 3
    if refused:
        with pytest.raises(InvalidArgument, match="message 2"):
            validation.batch(body, 1 << 20)
    else:
        assert len(validation.batch(body, 1 << 20).messages) == 3
