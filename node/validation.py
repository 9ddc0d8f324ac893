"""Validation at the edge: the checks a request passes before a node acts on it.

Both transports, gRPC (node/service.py) and the produce port (node/produce_port.py), hand
every request to these functions once, before anything reaches the Wal. A bad request
gets InvalidArgument naming the field: it never stalls the node, never reaches the log
and never touches another caller. Pure functions over protobuf messages and bytes.

Numbers. Terms below 1 are refused by the fencing rules (node/fencing.py), as always; a
follower's terms must be 1..2^63-1 (int64 on the wire). Offsets are int64 to every
reader (Spark's columns, Kafka-style tools), so a log may start (Assign's
`min_next_offset`) at most at MAX_START_OFFSET: from there it still has 2^62 offsets,
more than any disk holds.

Reserved properties. Keys starting with "_" belong to the system. `_t`, the message type,
is set by clients and read by every reader as an integer, so its value is checked
(streamwal.message.msg_type_of); a stored "abc" used to crash every reader at its offset,
forever. A batch whose bytes cannot hold a `_t` key (`may_hold_type`) is not looked
into. `_tt` and `_wt` are overwritten by the node on delivery; other reserved keys pass
through (Milvus's own among them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from streamwal.errors import InvalidArgument
from streamwal.message import PROP_TYPE, PROP_VCHANNEL, msg_type_of
from streamwal.proto import streaming_pb2 as pb

MAX_TERM = 2**63 - 1
MAX_OFFSET = 2**63 - 1
MAX_START_OFFSET = 2**62
MAX_REPLICAS = 9  # the coord's largest replica set (an odd count, 1..9)
MAX_ADDRESS_BYTES = 261  # a 253-byte DNS name, ':' and a 5-digit port, or [IPv6]:port
MAX_PRODUCER_ID = 128
# A `_t` map key is the bytes `_t` right after its length, the varint 2: the byte 0x02,
# or 0x00 ending an overlong form (0x82 0x00, ...). A body without that holds no `_t`.
# The literal `_t` first lets `re` scan for it fast; the look-behind then runs only at
# its hits. `_t` alone was found in ~63 % of 512-message batches of random 128-byte
# payloads, and each hit walked every message (docs/benchmarks.md, "Replicated path").
_TYPE_KEY = re.compile(rb"_t(?<=[\x00\x02]_t)")
# Scanning a body costs ~0.33 ns a byte, walking its messages' properties ~0.27 us a
# message (timeit, 2026-11-27): a batch of larger messages is walked, not scanned (64
# messages of 4 KiB: 41 us walked, 108 us scanned; 512 of 128 B: 149 walked, 37 scanned).
SCAN_MAX_BYTES_PER_MESSAGE = 1024


def term(value: int, field: str = "pchannel.term") -> None:
    if not 1 <= value <= MAX_TERM:
        raise InvalidArgument(f"{field} must be 1..{MAX_TERM}, got {value}")


def offset(value: int, field: str, limit: int = MAX_OFFSET) -> None:
    if not 0 <= value <= limit:
        raise InvalidArgument(f"{field} must be 0..{limit}, got {value}")


def address(value: str, field: str) -> None:
    """HOST:PORT of another node, port 1..65535."""
    host, sep, port = value.rpartition(":")
    if (
        len(value.encode()) > MAX_ADDRESS_BYTES
        or not sep
        or not host
        or not host.isprintable()
        or " " in host
        or not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)
    ):
        raise InvalidArgument(f"{field} must be HOST:PORT with a port 1..65535, got {value!r}")


def assign(req: pb.StreamingNodeManagerAssignRequest) -> None:
    offset(req.min_next_offset, "min_next_offset", MAX_START_OFFSET)
    if req.catch_up_from:
        address(req.catch_up_from, "catch_up_from")
    if req.HasField("replica_set"):
        members = req.replica_set.members
        if len(members) > MAX_REPLICAS:
            raise InvalidArgument(
                f"replica_set.members holds {len(members)} nodes, at most {MAX_REPLICAS}"
            )
        for i, m in enumerate(members):
            address(m.address, f"replica_set.members[{i}].address")
        if req.replica_set.leader.address:
            address(req.replica_set.leader.address, "replica_set.leader.address")


def fetch(req: pb.FetchRequest) -> None:
    offset(req.from_offset, "from_offset")
    if req.HasField("end_offset"):
        offset(req.end_offset, "end_offset")


def replica_ack(req: pb.ReplicaAck) -> None:
    term(req.term, "term")
    offset(req.acked_offset, "acked_offset")
    for i, start in enumerate(req.term_history):
        term(start.term, f"term_history[{i}].term")
        offset(start.first_offset, f"term_history[{i}].first_offset")


def producer_header(req: pb.CreateProducerRequest) -> None:
    name = req.producer_id
    if len(name) > MAX_PRODUCER_ID or not name.isprintable():
        raise InvalidArgument(f"producer_id must be <= {MAX_PRODUCER_ID} printable chars")
    if req.ack_level not in pb.AckLevel.values():
        raise InvalidArgument(f"ack_level {req.ack_level} is not an AckLevel")


def consumer_header(req: pb.CreateConsumerRequest) -> None:
    if req.options.HasField("end_offset"):
        offset(req.options.end_offset, "options.end_offset")


def batch(body: bytes, max_message_bytes: int) -> pb.MessageBatch:
    """The parsed MessageBatch of a produce or txn append, after every check: not empty,
    no message over `max_message_bytes`, reserved properties valid."""
    try:
        parsed = pb.MessageBatch.FromString(body)
    except DecodeError as exc:
        raise InvalidArgument(f"malformed MessageBatch: {exc}") from None
    if not parsed.messages:
        raise InvalidArgument("empty batch")
    if len(body) > max_message_bytes:  # only then can a single message be over the limit
        for i, msg in enumerate(parsed.messages):
            size = msg.ByteSize()
            if size > max_message_bytes:
                raise InvalidArgument(
                    f"message {i} of the batch is {size} bytes, "
                    f"over the {max_message_bytes}-byte limit"
                )
    messages = parsed.messages
    if len(body) > SCAN_MAX_BYTES_PER_MESSAGE * len(messages) or may_hold_type(body):
        reserved_properties(messages)
    return parsed


def may_hold_type(body: bytes) -> bool:
    """Whether a serialized message or batch may hold a `_t` property (False: it holds
    none, however its bytes are laid out)."""
    return b"_" in body and _TYPE_KEY.search(body) is not None  # `in`: a memchr, ~0.3 us


def message(msg: pb.Message, max_message_bytes: int) -> None:
    """A single message (ProduceMessageRequest, the seed's per-message produce)."""
    size = msg.ByteSize()
    if size > max_message_bytes:
        raise InvalidArgument(f"message is {size} bytes, over the {max_message_bytes}-byte limit")
    reserved_properties((msg,))


def reserved_properties(messages: Sequence[pb.Message], vchannel: str | None = None) -> None:
    """Every message's `_t` is a message type code; with `vchannel`, every message's `_vc`
    is it (a txn's messages all belong to the txn's vchannel).

    A batch's messages mostly share their properties, so the distinct `_t` values are
    gathered first and each checked once; the messages are walked one by one only to
    name the first bad one."""
    if vchannel is None:
        codes = {msg.properties.get(PROP_TYPE) for msg in messages}
        if all(is_msg_type(code) for code in codes):
            return
    for i, msg in enumerate(messages):
        props = msg.properties
        try:
            msg_type_of(props.get(PROP_TYPE))
        except ValueError as exc:
            raise InvalidArgument(f"message {i}: {exc}") from None
        if vchannel is not None and props.get(PROP_VCHANNEL) != vchannel:
            raise InvalidArgument(
                f"message {i} of the txn append has vchannel "
                f"{props.get(PROP_VCHANNEL)!r}, the txn's is {vchannel!r}"
            )


def is_msg_type(code: str | None) -> bool:
    """Whether `code` is a valid `_t` value (streamwal.message.msg_type_of)."""
    try:
        msg_type_of(code)
    except ValueError:
        return False
    return True


def txn_begin(req: pb.TxnBegin, max_keepalive_ms: int) -> None:
    if req.keepalive_ms > max_keepalive_ms:
        raise InvalidArgument(
            f"txn keepalive_ms {req.keepalive_ms} is over the node's limit of "
            f"{max_keepalive_ms} ms (--txn-max-keepalive)"
        )
