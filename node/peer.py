"""The node's own client of another node: Fetch records to catch up before serving, from
the other node's internal listener."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from streamwal.grpc_errors import from_rpc_error
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import make_internal_channel

FETCH = "/milvus.proto.streaming.StreamingNodeReplicationService/Fetch"


async def fetch(
    address: str, pchannel: str, from_offset: int, timeout: float | None = None
) -> AsyncIterator[pb.FetchResponse]:
    """Every stored record of `pchannel` from `from_offset` to the source's end."""
    try:
        channel = await make_internal_channel(address)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    try:
        call = channel.unary_stream(
            FETCH,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.FetchResponse.FromString,
        )(pb.FetchRequest(pchannel=pchannel, from_offset=from_offset), timeout=timeout)
        try:
            async for response in call:
                yield response
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
    finally:
        await channel.close()
