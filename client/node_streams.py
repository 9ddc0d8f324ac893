"""Opening a node's gRPC streams (Produce, Consume): the header rides in binary metadata.

The seed's convention: the stream's first message from the node answers the header with
its `create` member, or the stream ends with the node's refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio

from streamwal.errors import InvalidRequestSeq
from streamwal.grpc_errors import from_rpc_error

HANDLER = "/milvus.proto.streaming.StreamingNodeHandlerService/"


async def open_stream(
    channel: aio.Channel, rpc: str, header, response_cls, serializer: Callable[[Any], bytes]
):
    """Open a Produce/Consume stream with `header` and return (call, first response), which
    must be the `create` member. The call is cancelled if opening fails or is cancelled."""
    key = "create-producer-bin" if rpc == "Produce" else "create-consumer-bin"
    method = channel.stream_stream(
        HANDLER + rpc,
        request_serializer=serializer,
        response_deserializer=response_cls.FromString,
    )
    call = method(metadata=((key, header.SerializeToString()),))
    try:
        first = await call.read()
    except grpc.RpcError as exc:
        call.cancel()
        raise from_rpc_error(exc) from None
    except BaseException:
        call.cancel()
        raise
    if first is aio.EOF or first.WhichOneof("response") != "create":
        call.cancel()
        raise InvalidRequestSeq(f"the node did not answer the {rpc} header with `create`")
    return call, first
