"""A fuzzer (hypothesis) over every request a node takes, against one real node process.

Requests are generated from the protobuf descriptors of every RPC the node serves, with
values drawn towards the edges (0, -1, 2^62, 2^63-1, 2^64-1, names at and past their
limits, unknown enum values, reserved properties with good and bad values, garbage
bytes), and the produce port gets frames of every kind and length. Whatever comes, the
node must stay up, keep serving a bystander on another pchannel, never acknowledge a
batch the rules refuse (an independent oracle here decides which), never store one, and
keep its memory bounded.

The default run is bounded (a few hundred examples per test, seconds each);
STREAMWAL_FUZZ_EXAMPLES=5000 runs a long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc import aio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamwal import wire
from streamwal.client.node_client import NodeClient
from streamwal.grpc_errors import from_trailing
from streamwal.ids import encode_offset
from streamwal.proto import groups_pb2 as gpb
from streamwal.proto import milvus_pb2, wire_pb2
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import LocalNode
from streamwal.transport import make_channel
from tests.node.helpers import read_log, served_throughout
from tests.node.test_limits import _rss_mib

EXAMPLES = int(os.environ.get("STREAMWAL_FUZZ_EXAMPLES", "150"))
MAX_MESSAGE = 64 * 1024
FLAGS = (
    "--max-message-size", "64KiB",
    "--max-frame-size", "256KiB",
    "--max-receive-buffer", "1MiB",
    "--txn-max-open", "32",
    "--txn-max-open-per-stream", "4",
    "--header-timeout", "2s",
    # Every service on one port, so one channel fuzzes them all (the listeners' split is
    # tests/node/test_internal_listener.py's).
    "--internal-listen", "shared",
)  # fmt: skip
TERM = 1
UNARY_NAMES = ["fa-0", "fa-1"]  # the unary RPCs may assign, fence and remove these
STREAM_NAMES = ["fs-0", "fs-1"]  # produced and consumed under TERM, never managed
INVALID = b"\x00INVALID:"  # in every payload of a batch the rules refuse


def _settings(factor: float = 1.0) -> settings:
    return settings(
        max_examples=max(1, int(EXAMPLES * factor)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# -- values towards the edges ------------------------------------------------------------

_U64 = [0, 1, 2**31 - 1, 2**32, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1]
_I64 = [0, 1, -1, 2, 2**31 - 1, -(2**31), 2**62, 2**62 + 1, 2**63 - 1, -(2**63)]
_INTS: dict[int, st.SearchStrategy] = {
    FieldDescriptor.TYPE_UINT64: st.sampled_from(_U64) | st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: st.sampled_from(_U64) | st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_INT64: st.sampled_from(_I64) | st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.sampled_from(_I64) | st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.sampled_from([0, 1, 2**32 - 1]) | st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_INT32: st.sampled_from([0, -1, 2**31 - 1])
    | st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1),
}
_TEXT = (
    st.text(max_size=12) | st.text(min_size=190, max_size=260) | st.sampled_from(["", "\0", "a\nb"])
)
_ADDRESSES = st.sampled_from(["", "127.0.0.1:1", "localhost:1", "h:99999", "[::1]:1", "x", ":5"])
_TYPES_GOOD = ["400", "1200", "0", "2147483647", "", "007"]
_TYPES_BAD = ["abc", "-1", "2147483648", "12345678901", "\u0663", "4.0", " 400"]
_PROPERTIES = st.dictionaries(
    st.sampled_from(["_t", "_vc", "_tt", "_wt", "_bid", "k"]) | st.text(max_size=6),
    st.sampled_from(_TYPES_GOOD + _TYPES_BAD) | st.text(max_size=12),
    max_size=4,
)


def _offset_ids() -> st.SearchStrategy[bytes]:
    return st.sampled_from([encode_offset(v) for v in (0, 1, 5, 2**62, 2**64 - 1)]) | st.binary(
        max_size=10
    )


def _overrides(names: list[str]) -> dict[str, st.SearchStrategy]:
    """Fields whose values matter by name: pools the node knows, plus odd ones."""
    term = st.sampled_from([TERM, TERM, TERM, 0, 2, -1, 2**63 - 1])
    return {
        "name": st.sampled_from(names) | _TEXT,
        "pchannel": st.sampled_from(names) | _TEXT,  # FetchRequest, ReplicaAck: a string
        "term": term,
        "id": _offset_ids(),
        "address": _ADDRESSES,
        "catch_up_from": _ADDRESSES,
        "leader_address": _ADDRESSES,
        "messages": st.builds(lambda b: b[0], _batches()) | st.binary(max_size=40),
        "properties": _PROPERTIES,
        "vchannel": st.sampled_from([f"{n}_v0" for n in names]) | _TEXT,
        "group": st.sampled_from(["g", "h"]) | _TEXT,
    }


def messages(descriptor: Descriptor, names: list[str], depth: int = 0) -> st.SearchStrategy:
    """Any message of `descriptor`'s type, field by field (oneofs get one member)."""
    overrides = _overrides(names)

    @st.composite
    def build(draw):
        msg = _message_class(descriptor)()
        chosen = {o.name: draw(st.sampled_from([None, *o.fields])) for o in descriptor.oneofs}
        for field in descriptor.fields:
            oneof = field.containing_oneof
            if oneof is not None and chosen[oneof.name] is not field:
                continue
            if oneof is None and not draw(st.booleans()):
                continue  # left unset
            _set(msg, field, draw, overrides, names, depth)
        return msg

    return build()


def _set(msg, field: FieldDescriptor, draw, overrides, names: list[str], depth: int) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value = draw(overrides.get(field.name, st.dictionaries(_TEXT, _TEXT, max_size=3)))
        getattr(msg, field.name).update(value)
        return
    one = _value(field, overrides, names, depth)
    if one is None:
        return
    if field.is_repeated:
        values = draw(st.lists(one, max_size=3 if depth < 2 else 0))
        target = getattr(msg, field.name)
        for v in values:
            if field.message_type is not None:
                target.add().CopyFrom(v)
            else:
                target.append(v)
        return
    value = draw(one)
    if field.message_type is not None:
        getattr(msg, field.name).CopyFrom(value)
    else:
        setattr(msg, field.name, value)


def _value(field: FieldDescriptor, overrides, names: list[str], depth: int):
    if field.name in overrides and field.message_type is None:
        return overrides[field.name]
    if field.message_type is not None:
        if depth >= 3:
            return None
        return messages(field.message_type, names, depth + 1)
    if field.type in _INTS:
        return _INTS[field.type]
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from(known) | st.integers(-3, 1000)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _TEXT
    return st.binary(max_size=40)


def _message_class(descriptor: Descriptor) -> type:
    return GetMessageClass(descriptor)


# -- batches and the oracle ----------------------------------------------------------------


def valid_type(value: str | None) -> bool:
    """The oracle's own rule for `_t`: absent or empty, or 1..10 ASCII digits <= 2^31-1."""
    return not value or (re.fullmatch(r"[0-9]{1,10}", value) is not None and int(value) < 2**31)


def batch_is_valid(body: bytes) -> bool:
    try:
        batch = pb.MessageBatch.FromString(body)
    except Exception:
        return False
    return bool(batch.messages) and all(
        m.ByteSize() <= MAX_MESSAGE and valid_type(m.properties.get("_t")) for m in batch.messages
    )


def _batches() -> st.SearchStrategy[tuple[bytes, bool]]:
    """(serialized MessageBatch, whether the rules accept it); a refused batch's payloads
    carry INVALID, so the log can be searched for any that got in."""

    plain = st.sampled_from([{}, {}, {"_t": "400"}, {"_vc": "fs-0_v0", "_t": "1200"}, {"k": "v"}])

    @st.composite
    def build(draw):
        props = draw(
            st.lists(plain, min_size=1, max_size=4)
            if draw(st.integers(0, 2))
            else st.lists(_PROPERTIES, min_size=0, max_size=4)
        )
        big = draw(st.sampled_from([0] * 9 + [MAX_MESSAGE]))
        batch = pb.MessageBatch(messages=[pb.Message(properties=p) for p in props])
        ok = batch_is_valid(batch.SerializeToString()) and not big
        tag = draw(st.integers(0, 2**32))
        for i, m in enumerate(batch.messages):
            m.payload = (b"ok:%d.%d" if ok else INVALID + b"%d.%d") % (tag, i) + b"p" * big
        return batch.SerializeToString(), ok

    return build()


# -- the node ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    node = LocalNode(tmp_path_factory.mktemp("fuzz") / "node", extra_args=FLAGS).start(60)
    try:
        yield node
    finally:
        if node.proc is not None and node.proc.poll() is not None:
            print(f"--- the fuzzed node died ---\n{node.log_tail()}")
        node.kill()


class Session:
    """One event loop, one client and a bystander for a whole hypothesis run."""

    def __init__(self, node: LocalNode) -> None:
        self.node = node
        self.loop = asyncio.new_event_loop()
        self.channel: aio.Channel | None = None
        self.client: NodeClient | None = None

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    def alive(self) -> None:
        assert self.node.proc.poll() is None, f"the node died:\n{self.node.log_tail()}"

    def no_errors_logged(self) -> None:
        """Nothing failed inside the node (an exception in a handler or a callback)."""
        errors = [
            line
            for line in self.node.log_path.read_text().splitlines()
            if '"level": "error"' in line or "Traceback" in line
        ]
        assert not errors, "\n".join(errors[:5])


_sessions = itertools.count()


@contextlib.contextmanager
def session(node: LocalNode) -> Iterator[Session]:
    s = Session(node)
    bystander = None

    async def open_() -> None:
        nonlocal bystander
        s.client = NodeClient(node.address)
        await s.client.wait_ready(30)
        for name in UNARY_NAMES + STREAM_NAMES:
            with contextlib.suppress(Exception):
                await s.client.assign(name, TERM)
        s.channel = make_channel(node.address)
        bystander = served_throughout(s.client, f"bystander-{next(_sessions)}")
        await bystander.__aenter__()

    async def close() -> None:
        await bystander.__aexit__(None, None, None)
        await s.channel.close()
        await s.client.close()

    try:
        s.run(open_())
        baseline = _rss_mib(node.proc.pid)
        yield s
        s.alive()
        s.no_errors_logged()
        assert _rss_mib(node.proc.pid) - baseline < 200, "the node's memory grew"
        s.run(close())
    finally:
        for task in asyncio.all_tasks(s.loop):
            task.cancel()
        with contextlib.suppress(Exception):
            s.loop.run_until_complete(asyncio.wait_for(_quietly_close(s), 10))
        s.loop.close()


async def _quietly_close(s: Session) -> None:
    """After a failure: close what the session opened, whatever state it is in."""
    for closing in (s.channel, s.client):
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing.close()


def _raw(channel: aio.Channel, method: str, kind: str) -> Callable:
    return getattr(channel, kind)(method, request_serializer=None, response_deserializer=None)


async def _outcome(call) -> tuple[grpc.StatusCode, object, str]:
    """How a finished call ended: its status, the StreamingError the node sent (if any)
    and the details."""
    code = await call.code()
    return code, from_trailing(await call.trailing_metadata()), await call.details()


# The client's own ending of a call it wrote to after the node had ended it.
_CLIENT_SIDE = "Internal error from Core"


def _check_refusal(outcome: tuple[grpc.StatusCode, object, str], what: str) -> None:
    """A failed call is the node's typed refusal, a limit, or a malformed request; never
    an unexpected exception in a handler (gRPC's UNKNOWN; the node's log is checked too)."""
    code, err, details = outcome
    if code == grpc.StatusCode.OK or err is not None:
        return
    assert code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ) or (code == grpc.StatusCode.INTERNAL and details == _CLIENT_SIDE), (what, code, details)


_ENDED = (grpc.RpcError, asyncio.InvalidStateError)  # writing to a call the node ended


# -- unary and server-streaming RPCs -------------------------------------------------------

UNARY = {
    "/milvus.proto.streaming.StreamingNodeManagerService/Assign": (
        pb.StreamingNodeManagerAssignRequest
    ),
    "/milvus.proto.streaming.StreamingNodeManagerService/Remove": (
        pb.StreamingNodeManagerRemoveRequest
    ),
    "/milvus.proto.streaming.StreamingNodeManagerService/CollectStatus": (
        pb.StreamingNodeManagerCollectStatusRequest
    ),
    "/milvus.proto.streaming.StreamingNodeReplicationService/Fence": pb.FenceRequest,
    "/milvus.proto.streaming.StreamingNodeBatchService/Fence": pb.FenceBatchRequest,
    "/milvus.proto.streaming.StreamingNodeBatchService/Assign": pb.AssignBatchRequest,
    "/milvus.proto.streaming.StreamingNodeBatchService/Remove": pb.RemoveBatchRequest,
    "/milvus.proto.streaming.StreamingNodeStateService/GetComponentStates": (
        milvus_pb2.GetComponentStatesRequest
    ),
    "/streamwal.groups.StreamingNodeConsumerGroupService/CreateConsumerGroup": (
        gpb.CreateConsumerGroupRequest
    ),
    "/streamwal.groups.StreamingNodeConsumerGroupService/DestroyConsumerGroup": (
        gpb.DestroyConsumerGroupRequest
    ),
    "/streamwal.groups.StreamingNodeConsumerGroupService/GroupConsume": gpb.GroupConsumeRequest,
    "/streamwal.groups.StreamingNodeConsumerGroupService/GroupSeek": gpb.GroupSeekRequest,
    "/streamwal.wire.StreamingNodeInfoService/Describe": wire_pb2.DescribeNodeRequest,
    "/grpc.health.v1.Health/Check": None,  # garbage bytes only
}


def _unary_requests() -> st.SearchStrategy[tuple[str, bytes, object]]:
    def for_method(method: str) -> st.SearchStrategy:
        cls = UNARY[method]
        generated = (
            messages(cls.DESCRIPTOR, UNARY_NAMES).map(lambda m: (m.SerializeToString(), m))
            if cls is not None
            else st.nothing()
        )
        garbage = st.binary(max_size=30).map(lambda b: (b, None))
        return (generated | garbage).map(lambda pair: (method, *pair))

    return st.sampled_from(sorted(UNARY)).flatmap(for_method)


def _must_refuse(method: str, req) -> bool:
    """Requests the rules refuse whatever the node's state: acknowledging one is a bug."""
    if not method.endswith("ManagerService/Assign") or req is None:
        return False
    name = req.pchannel.name
    raw = name.encode()
    return (
        req.min_next_offset > 2**62
        or not raw
        or len(raw) > 200
        or not name.isprintable()
        or req.pchannel.term < 1
        or (
            req.HasField("retention") and min(req.retention.max_age_ms, req.retention.max_bytes) < 0
        )
        or len(req.replica_set.members) > 9
    )


def test_fuzz_unary_requests(fuzz_node: LocalNode) -> None:
    with session(fuzz_node) as s:

        async def call(method: str, body: bytes, req) -> None:
            unary = _raw(s.channel, method, "unary_unary")(body, timeout=5)
            with contextlib.suppress(grpc.RpcError):
                await unary
            outcome = await _outcome(unary)
            _check_refusal(outcome, method)
            if _must_refuse(method, req):
                assert outcome[0] != grpc.StatusCode.OK, f"{method} acknowledged {req}"

        @_settings(2)
        @given(_unary_requests())
        def one(request) -> None:
            s.run(call(*request))
            s.alive()

        one()


def test_fuzz_fetch_and_replicate(fuzz_node: LocalNode) -> None:
    fetch = "/milvus.proto.streaming.StreamingNodeReplicationService/Fetch"
    replicate = "/milvus.proto.streaming.StreamingNodeReplicationService/Replicate"
    names = UNARY_NAMES + STREAM_NAMES
    with session(fuzz_node) as s:

        async def drain(call) -> None:
            with contextlib.suppress(grpc.RpcError, TimeoutError):
                for _ in range(20):
                    if await asyncio.wait_for(call.read(), 0.2) is aio.EOF:
                        break
            call.cancel()
            _check_refusal(await _outcome(call), "Fetch/Replicate")

        async def go(kind: str, first: bytes, acks: list[bytes]) -> None:
            if kind == "fetch":
                await drain(_raw(s.channel, fetch, "unary_stream")(first, timeout=5))
                return
            call = _raw(s.channel, replicate, "stream_stream")(timeout=5)
            with contextlib.suppress(*_ENDED):
                for body in [first, *acks]:
                    await call.write(body)
            await drain(call)

        serialized = st.builds(
            lambda m: m.SerializeToString(), messages(pb.FetchRequest.DESCRIPTOR, names)
        )
        acks = st.builds(lambda m: m.SerializeToString(), messages(pb.ReplicaAck.DESCRIPTOR, names))

        @_settings(0.5)
        @given(
            st.sampled_from(["fetch", "replicate"]),
            serialized | acks | st.binary(max_size=20),
            st.lists(acks | st.binary(max_size=10), max_size=3),
        )
        def one(kind: str, first: bytes, more: list[bytes]) -> None:
            s.run(go(kind, first, more))
            s.alive()

        one()


# -- producers: gRPC streams and the produce port ------------------------------------------


@st.composite
def _produce_requests(draw) -> tuple[bytes, bool | None]:
    """(a serialized ProduceRequest or garbage, whether a produce of it must be refused:
    True refused, False acceptable, None not a produce)."""
    kind = draw(
        st.sampled_from(["batch", "batch", "batch", "single", "txn", "close", "any", "garbage"])
    )
    rid = draw(st.integers(-(2**63), 2**63 - 1))
    if kind == "batch":
        body, ok = draw(_batches() | st.tuples(st.binary(max_size=20), st.just(False)))
        ok = ok and batch_is_valid(body)
        seq = draw(st.sampled_from([0, 0, 1, 2**64 - 1]))
        tick = draw(st.sampled_from([0, 0, 1, 2**64 - 1]))
        req = pb.ProduceRequest(
            produce_batch=pb.ProduceBatchRequest(
                request_id=rid, messages=body, sequence=seq, barrier_time_tick=tick
            )
        )
        return req.SerializeToString(), not ok
    if kind == "single":
        props = draw(_PROPERTIES)
        ok = valid_type(props.get("_t"))
        tag = draw(st.integers(0, 2**32))
        payload = (b"ok:%d" if ok else INVALID + b"%d") % tag
        msg = pb.Message(payload=payload, properties=props)
        req = pb.ProduceRequest(produce=pb.ProduceMessageRequest(request_id=rid, message=msg))
        return req.SerializeToString(), not ok
    if kind == "txn":
        txn = draw(messages(pb.TxnRequest.DESCRIPTOR, STREAM_NAMES))
        if txn.HasField("append"):  # appended messages count only once committed
            body, _ = draw(_batches())
            txn.append.messages = body
        return pb.ProduceRequest(txn=txn).SerializeToString(), None
    if kind == "close":
        return pb.ProduceRequest(close=pb.CloseProducerRequest()).SerializeToString(), None
    if kind == "any":
        return draw(messages(pb.ProduceRequest.DESCRIPTOR, STREAM_NAMES)).SerializeToString(), None
    return draw(st.binary(max_size=30)), None


# Always tried first, so that every run sees the node acknowledge something.
_GOOD_HEADER = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=STREAM_NAMES[0], term=TERM))
_GOOD_BATCH = (
    pb.ProduceRequest(
        produce_batch=pb.ProduceBatchRequest(
            request_id=1,
            messages=pb.MessageBatch(
                messages=[pb.Message(payload=b"ok:known")]
            ).SerializeToString(),
        )
    ).SerializeToString(),
    False,
)


def _headers() -> st.SearchStrategy[pb.CreateProducerRequest]:
    """Mostly headers the node takes, so that the requests behind them are acted on."""
    good = st.builds(
        lambda name, pid, level: pb.CreateProducerRequest(
            pchannel=pb.PChannelInfo(name=name, term=TERM), producer_id=pid, ack_level=level
        ),
        st.sampled_from(STREAM_NAMES),
        st.sampled_from(["", "", "", "fuzz-producer", "x" * 129, "a\nb"]),
        st.sampled_from([0, 0, 0, 1, 2, 7, -1]),
    )
    odd = messages(pb.CreateProducerRequest.DESCRIPTOR, STREAM_NAMES)
    return st.integers(0, 3).flatmap(lambda n: good if n else odd)


class Acks:
    """What the node acknowledged, checked against the oracle (and the log, later)."""

    def __init__(self) -> None:
        self.batches = 0

    def check(self, answers: list[pb.ProduceResponse], acceptable: Counter[int]) -> None:
        """No request id gets more acknowledgements than it had acceptable requests (a
        client may reuse an id; answers come in completion order)."""
        acked: Counter[int] = Counter()
        for answer in answers:
            kind = answer.WhichOneof("response")
            if kind not in ("produce_batch", "produce"):
                continue
            r = getattr(answer, kind)
            if r.WhichOneof("response") == "result":
                acked[r.request_id] += 1
                assert acked[r.request_id] <= acceptable[r.request_id], (
                    f"acknowledged a refused {answer}"
                )
                self.batches += 1


def _expectations(requests: list[tuple[bytes, bool | None]]) -> Counter[int]:
    """request id -> how many produce requests with that id the rules accept (the
    oracle reads every request that parses, however it was generated)."""
    out: Counter[int] = Counter()
    for body, _ in requests:
        try:
            req = pb.ProduceRequest.FromString(body)
        except Exception:
            continue
        kind = req.WhichOneof("request")
        if kind == "produce_batch" and batch_is_valid(req.produce_batch.messages):
            out[req.produce_batch.request_id] += 1
        elif kind == "produce":
            single = pb.MessageBatch(messages=[req.produce.message]).SerializeToString()
            if batch_is_valid(single):
                out[req.produce.request_id] += 1
    return out


def _answers(frames: list[bytes]) -> list[pb.ProduceResponse]:
    out = []
    for body in frames:
        with contextlib.suppress(Exception):
            out.append(pb.ProduceResponse.FromString(body))
    return out


def test_fuzz_produce_streams(fuzz_node: LocalNode) -> None:
    method = "/milvus.proto.streaming.StreamingNodeHandlerService/Produce"
    acks = Acks()
    with session(fuzz_node) as s:

        async def go(header: bytes, requests: list[tuple[bytes, bool | None]]) -> None:
            call = _raw(s.channel, method, "stream_stream")(
                metadata=(("create-producer-bin", header),), timeout=10
            )
            frames: list[bytes] = []
            with contextlib.suppress(*_ENDED):
                for body, _ in requests:
                    await call.write(body)
                await call.done_writing()
            with contextlib.suppress(grpc.RpcError):
                while (got := await call.read()) is not aio.EOF:
                    frames.append(got)
            _check_refusal(await _outcome(call), "Produce")
            acks.check(_answers(frames), _expectations(requests))

        @_settings()
        @given(
            _headers().map(lambda h: h.SerializeToString()) | st.binary(max_size=20),
            st.lists(_produce_requests(), min_size=1, max_size=6),
        )
        @example(_GOOD_HEADER.SerializeToString(), [_GOOD_BATCH])
        def one(header: bytes, requests) -> None:
            s.run(go(header, requests))
            s.alive()

        one()
        s.run(_no_invalid_stored(s.client))
    assert acks.batches > 0, "nothing was ever acknowledged: the fuzzer missed the node"


def _frames() -> st.SearchStrategy[bytes]:
    """Produce-port bytes: frames of every kind, true or false lengths, cut anywhere."""
    request = _produce_requests().map(lambda r: r[0])
    kind = st.sampled_from(sorted(wire.KINDS)) | st.integers(0, 255)
    framed = st.builds(lambda k, body: wire.frame(k, body), kind, request | st.binary(max_size=20))
    false_length = st.builds(
        lambda length, k, body: struct.pack(">IB", length, k) + body,
        st.sampled_from([0, 1, 2**18, 2**18 + 1, 2**20, 2**31, 2**32 - 1])
        | st.integers(0, 2**32 - 1),
        kind,
        st.binary(max_size=20),
    )
    return framed | false_length


def _produce_frames(chunks: list[bytes]) -> list[bytes]:
    """The bodies of the chunks that are exactly one produce-request frame."""
    bodies = []
    for chunk in chunks:
        if len(chunk) >= 5:
            length, kind = struct.unpack(">IB", chunk[:5])
            if kind == wire.PRODUCE_REQUEST and length == len(chunk) - 5:
                bodies.append(chunk[5:])
    return bodies


def test_fuzz_produce_port_framing(fuzz_node: LocalNode) -> None:
    acks = Acks()
    with session(fuzz_node) as s:

        async def go(header: bytes, requests, junk: list[bytes], cut: int | None) -> None:
            port = (await s.client.describe()).produce_port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data = header + b"".join(wire.frame(wire.PRODUCE_REQUEST, b) for b, _ in requests)
            data += b"".join(junk)
            if cut is not None:
                data = data[:cut]
            frames: list[bytes] = []
            try:
                writer.write(data)
                writer.write_eof()
                while (
                    got := await asyncio.wait_for(wire.read_frame(reader, 1 << 26), 10)
                ) is not None:
                    kind, body = got
                    assert kind in (wire.PRODUCE_RESPONSE, wire.ERROR), kind
                    if kind == wire.PRODUCE_RESPONSE:
                        frames.append(body)
            except (ConnectionError, wire.FrameError):
                pass
            finally:
                writer.close()
            # Junk may hold well-formed produce requests too (a frame of that kind with a
            # valid body): the oracle counts them as acceptable, however they were drawn.
            sent = [*requests, *((body, None) for body in _produce_frames(junk))]
            acks.check(_answers(frames), _expectations(sent))

        framed = _headers().map(lambda h: wire.frame(wire.CREATE_PRODUCER, h.SerializeToString()))
        header = st.integers(0, 4).flatmap(lambda n: framed if n else _frames())

        @_settings()
        @given(
            header,
            st.lists(_produce_requests(), max_size=5),
            st.lists(_frames(), max_size=2),
            st.integers(0, 3).flatmap(lambda n: st.none() if n else st.integers(0, 400)),
        )
        @example(
            wire.frame(wire.CREATE_PRODUCER, _GOOD_HEADER.SerializeToString()),
            [_GOOD_BATCH],
            [],
            None,
        )
        @example(  # a valid produce request among the junk is acknowledged, rightly
            b"\x00\x00\x00\n\x01\n\x08\n\x04fs-0\x10\x01",
            [],
            [wire.frame(2, b"R\x00"), wire.frame(2, b"R\x0c\x12\n\n\x08\n\x06ok:0.0")],
            None,
        )
        def one(head: bytes, requests, junk: list[bytes], cut: int | None) -> None:
            s.run(go(head, requests, junk, cut))
            s.alive()

        one()
        s.run(_no_invalid_stored(s.client))
    assert acks.batches > 0, "nothing was ever acknowledged: the fuzzer missed the node"


async def _no_invalid_stored(client: NodeClient) -> None:
    """No message of a refused batch is in the log, and every stored `_t` is valid."""
    for name in STREAM_NAMES:
        with contextlib.suppress(Exception):
            await client.assign(name, TERM)  # (a fuzzed request may not have left it served)
        for m in await read_log(client, name, TERM):
            assert INVALID not in m.payload, f"{name}@{m.offset} holds a refused message"
            assert valid_type(m._msg.properties.get("_t")), f"{name}@{m.offset}: {m.properties}"


# -- consumers ------------------------------------------------------------------------------


def test_fuzz_consume_streams(fuzz_node: LocalNode) -> None:
    method = "/milvus.proto.streaming.StreamingNodeHandlerService/Consume"
    with session(fuzz_node) as s:

        async def go(header: bytes, requests: list[bytes]) -> None:
            call = _raw(s.channel, method, "stream_stream")(
                metadata=(("create-consumer-bin", header),), timeout=5
            )
            with contextlib.suppress(*_ENDED, TimeoutError):
                for body in requests:
                    await call.write(body)
                for _ in range(5):
                    if await asyncio.wait_for(call.read(), 0.1) is aio.EOF:
                        break
            call.cancel()
            _check_refusal(await _outcome(call), "Consume")

        consume_requests = st.builds(
            lambda m: m.SerializeToString(), messages(pb.ConsumeRequest.DESCRIPTOR, STREAM_NAMES)
        )

        @_settings(0.5)
        @given(
            st.builds(
                lambda m: m.SerializeToString(),
                messages(pb.CreateConsumerRequest.DESCRIPTOR, STREAM_NAMES),
            )
            | st.binary(max_size=20),
            st.lists(consume_requests | st.binary(max_size=10), max_size=2),
        )
        def one(header: bytes, requests: list[bytes]) -> None:
            s.run(go(header, requests))
            s.alive()

        one()


def test_the_oracle_agrees_with_the_rules() -> None:
    """The fuzzer's own rule for `_t` (a regex) and the node's (streamwal.message)."""
    from streamwal.message import msg_type_of

    for value in _TYPES_GOOD + _TYPES_BAD + ["1" * 10, "2147483647", "02147483647"]:
        try:
            msg_type_of(value)
            theirs = True
        except ValueError:
            theirs = False
        assert valid_type(value) == theirs, value
