"""The internal listener: the manager and replication services are not on the port
clients reach, and the coord's and peers' calls find them through Describe."""

from __future__ import annotations

import grpc
import pytest

from streamwal.client.node_client import NodeClient
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import internal_address, make_channel
from tests.node.conftest import StartNode

INTERNAL = [
    ("/milvus.proto.streaming.StreamingNodeManagerService/Assign",
     pb.StreamingNodeManagerAssignRequest(pchannel=pb.PChannelInfo(name="x", term=1))),
    ("/milvus.proto.streaming.StreamingNodeManagerService/Remove",
     pb.StreamingNodeManagerRemoveRequest(pchannel=pb.PChannelInfo(name="x", term=1))),
    ("/milvus.proto.streaming.StreamingNodeReplicationService/Fence",
     pb.FenceRequest(pchannel=pb.PChannelInfo(name="x", term=5))),
    ("/milvus.proto.streaming.StreamingNodeBatchService/Fence",
     pb.FenceBatchRequest(items=[pb.FenceRequest(pchannel=pb.PChannelInfo(name="x", term=5))])),
    ("/milvus.proto.streaming.StreamingNodeBatchService/Assign", pb.AssignBatchRequest()),
    ("/milvus.proto.streaming.StreamingNodeBatchService/Remove", pb.RemoveBatchRequest()),
]  # fmt: skip
FETCH = "/milvus.proto.streaming.StreamingNodeReplicationService/Fetch"


async def test_the_client_port_serves_no_manager_or_replication_call(
    start_node: StartNode,
) -> None:
    node = start_node()
    async with make_channel(node.address) as channel:
        for method, request in INTERNAL:
            call = channel.unary_unary(method, request_serializer=type(request).SerializeToString)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        fetch = channel.unary_stream(FETCH, request_serializer=pb.FetchRequest.SerializeToString)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in fetch(pb.FetchRequest(pchannel="x"), timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # CollectStatus (read-only) is answered there too: clients ask a pchannel's end.
        status = pb.StreamingNodeManagerCollectStatusRequest()
        collect = channel.unary_unary(
            "/milvus.proto.streaming.StreamingNodeManagerService/CollectStatus",
            request_serializer=pb.StreamingNodeManagerCollectStatusRequest.SerializeToString,
            response_deserializer=pb.StreamingNodeManagerCollectStatusResponse.FromString,
        )
        assert list((await collect(status, timeout=5)).channels) == []
    # The internal port is the one Describe names; the manager answers there.
    where = await internal_address(node.address)
    assert where == f"127.0.0.1:{node.internal_port}" != node.address
    async with NodeClient(node.address) as client:
        await client.assign("pch-internal", 1)
        status = await client.collect_status()
        assert [c.pchannel.name for c in status.channels] == ["pch-internal"]
        producer = await client.producer("pch-internal", 1)
        await producer.send(b"hello")
        await producer.close()


async def test_shared_keeps_one_port_as_the_seed(start_node: StartNode) -> None:
    node = start_node("n1", "--internal-listen=shared")
    assert await internal_address(node.address) == node.address
    async with NodeClient(node.address) as client:
        await client.assign("pch-shared", 1)
        assert [c.pchannel.name for c in (await client.collect_status()).channels] == ["pch-shared"]
