"""The coord's node calls batched per node (coord/node_link.py): the Coalescer over a
fake send, and the one-at-a-time fallback against a node without the batch service."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from streamwal import transport
from streamwal.coord.node_link import Coalescer, NodeLinks
from streamwal.errors import ChannelNotExist, StreamingError, Unavailable
from streamwal.grpc_errors import abort
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import wire_pb2

_INFO = "streamwal.wire.StreamingNodeInfoService"
_MANAGER = "milvus.proto.streaming.StreamingNodeManagerService"
_REPLICATION = "milvus.proto.streaming.StreamingNodeReplicationService"


async def _fake_node(methods: dict[tuple[str, str], tuple]) -> tuple[grpc.aio.Server, str]:
    """A started gRPC server answering the unary `methods` ((service, method) ->
    (handler, request class)) on loopback, and its address."""
    services: dict[str, dict] = {}
    for (service, method), (handler, request_cls) in methods.items():
        services.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
            handler, request_cls.FromString, lambda m: m.SerializeToString()
        )
    server = transport.make_server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(name, h) for name, h in services.items()]
    )
    port = transport.bind(server, "127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_calls_for_a_node_made_together_travel_in_one_batch_each_with_its_answer():
    sent: list[tuple[str, list[str], float]] = []

    async def send(address: str, requests: list, timeout: float) -> list:
        sent.append((address, list(requests), timeout))
        return [ChannelNotExist(r) if r.startswith("gone") else f"ok {r}" for r in requests]

    batches = Coalescer(send, window=0.01, limit=3)
    calls = [
        batches.call("n1", "a", 1.0),
        batches.call("n2", "b", 1.0),
        batches.call("n1", "gone-c", 2.5),
        batches.call("n1", "d", 1.0),
        batches.call("n1", "e", 1.0),  # past the limit: the next batch
    ]
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[:2] == ["ok a", "ok b"] and got[3:] == ["ok d", "ok e"]
    assert isinstance(got[2], ChannelNotExist)  # its own error, the others unaffected
    # one call per node and window; the batch's deadline is its longest item's
    assert sorted(sent) == [
        ("n1", ["a", "gone-c", "d"], 2.5),
        ("n1", ["e"], 1.0),
        ("n2", ["b"], 1.0),
    ]


async def test_a_failed_batch_call_fails_each_item_and_a_cancelled_caller_leaves_the_rest():
    release = asyncio.Event()

    async def send(address: str, requests: list, timeout: float) -> list:
        await release.wait()
        if address == "down":
            raise Unavailable("DEADLINE_EXCEEDED")
        return list(requests)

    batches = Coalescer(send, window=0.0)
    down = [asyncio.ensure_future(batches.call("down", r, 1.0)) for r in "xy"]
    up = [asyncio.ensure_future(batches.call("up", r, 1.0)) for r in "pq"]
    await asyncio.sleep(0.01)
    up[0].cancel()  # its caller gave up (the saga's task was cancelled)
    release.set()
    for call in down:
        with pytest.raises(StreamingError, match="DEADLINE_EXCEEDED"):
            await call
    assert await up[1] == "q"
    assert up[0].cancelled()


async def test_a_node_without_the_batch_service_is_called_one_item_at_a_time():
    """An older node (no StreamingNodeBatchService) answers UNIMPLEMENTED once; its
    items then go one call each, each with its own answer."""
    calls: list[str] = []

    async def describe(_request, _context):
        return wire_pb2.DescribeNodeResponse(server_id=1)  # internal_port 0: this port

    async def fence(request, _context):
        calls.append(f"fence {request.pchannel.name}")
        return pb.FenceResponse(next_offset=len(request.pchannel.name))

    async def remove(request, context):
        calls.append(f"remove {request.pchannel.name}")
        await abort(context, ChannelNotExist(request.pchannel.name))

    server, address = await _fake_node(
        {
            (_INFO, "Describe"): (describe, wire_pb2.DescribeNodeRequest),
            (_REPLICATION, "Fence"): (fence, pb.FenceRequest),
            (_MANAGER, "Remove"): (remove, pb.StreamingNodeManagerRemoveRequest),
        }
    )
    links = NodeLinks()
    try:
        a, b = await asyncio.gather(
            links.fence(address, "a", 2, 5.0), links.fence(address, "bb", 2, 5.0)
        )
        assert (a.next_offset, b.next_offset) == (1, 2)
        with pytest.raises(ChannelNotExist):
            await links.remove(address, "c", 2, 5.0)
        assert sorted(calls) == ["fence a", "fence bb", "remove c"]
    finally:
        await links.close()
        await server.stop(None)


async def test_a_node_marked_to_reconnect_whose_channel_was_dropped_meanwhile_is_called():
    """`reconnect` (the node answers again) and the drop of a failing channel (a call on
    it failed) can both happen before the next call: that call opens one new channel. It
    raised KeyError once, which ended the coord's probe loop (CI, 2026-11-27)."""

    async def describe(_request, _context):
        return wire_pb2.DescribeNodeResponse(server_id=1)

    async def status(_request, _context):
        return pb.StreamingNodeManagerCollectStatusResponse(server_id=1)

    server, address = await _fake_node(
        {
            (_INFO, "Describe"): (describe, wire_pb2.DescribeNodeRequest),
            (_MANAGER, "CollectStatus"): (status, pb.StreamingNodeManagerCollectStatusRequest),
        }
    )
    links = NodeLinks()
    try:
        assert (await links.collect_status(address, 5.0)).server_id == 1
        links.reconnect(address)
        await links._retire(address)  # what a failed call's drop does meanwhile
        assert (await links.collect_status(address, 5.0)).server_id == 1
    finally:
        await links.close()
        await server.stop(None)
