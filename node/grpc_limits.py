"""The node's limits on gRPC calls (node/limits.py), as a server interceptor.

It also makes a malformed unary request INVALID_ARGUMENT on every service (the node's own
parse their requests tolerantly, node/service.py; health and Describe are generated
handlers, which answered garbage with gRPC's UNKNOWN).

A call over the calls in total (`streams`), over its connection's calls
(`streams_per_connection`), or opening one more connection with calls from a peer
address that holds its limit of them (`connections_per_peer`) ends at once with
RESOURCE_EXHAUSTED naming the limit. The connection is the call's peer (address and
port), as gRPC reports it. What gRPC enforces itself is set in `server_options`: the
connections in total, the largest message (checked on its length prefix, before its
body is read), the handshake of a new connection and idle connections.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable

import grpc
from grpc import aio

from streamwal.errors import InvalidArgument
from streamwal.grpc_errors import abort
from streamwal.node.config import NodeConfig
from streamwal.node.limits import LimitExceeded, PeerCounts, drop
from streamwal.node.produce_stream import Malformed


def server_options(cfg: NodeConfig) -> list[tuple[str, int]]:
    """gRPC's own limits, from the node's configuration."""
    return [
        ("grpc.max_receive_message_length", cfg.max_frame_bytes),
        ("grpc.max_allowed_incoming_connections", cfg.max_connections),
        ("grpc.server_handshake_timeout_ms", round(cfg.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", round(cfg.idle_timeout_s * 1000)),
    ]


class CallLimits(aio.ServerInterceptor):
    def __init__(self, cfg: NodeConfig, count: Callable[[LimitExceeded], None]) -> None:
        self._max_calls = cfg.max_streams
        self._max_per_connection = cfg.max_streams_per_connection
        self._count = count
        self.calls = 0
        self._per_connection: Counter[str] = Counter()
        self.connections = PeerCounts(
            cfg.max_connections,
            cfg.max_connections_per_peer,
            "connections",
            "connections_per_peer",
            "gRPC connections with calls",
        )
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation, details):
        wrapped = self._wrapped.get(details.method)
        if wrapped is None and details.method not in self._wrapped:
            wrapped = self._wrapped[details.method] = self._wrap(await continuation(details))
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None:
            return None
        kind = (
            f"{'stream' if handler.request_streaming else 'unary'}_"
            f"{'stream' if handler.response_streaming else 'unary'}"
        )
        behavior = getattr(handler, kind)
        admit = self._admit
        if inspect.isasyncgenfunction(behavior):

            async def limited(request, context):
                await admit(request, context)
                async for response in behavior(request, context):
                    yield response

        elif inspect.iscoroutinefunction(behavior):

            async def limited(request, context):
                await admit(request, context)
                return await behavior(request, context)

        else:  # a synchronous handler runs in gRPC's thread pool: not the node's
            return handler
        deserialize = handler.request_deserializer
        if not handler.request_streaming and deserialize is not None:
            deserialize = _tolerant(deserialize)
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(
            limited,
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )

    async def _admit(self, request, context: aio.ServicerContext) -> None:
        """Count the call, or end it with RESOURCE_EXHAUSTED (raises); a malformed unary
        request ends with INVALID_ARGUMENT."""
        if isinstance(request, Malformed):
            await abort(context, InvalidArgument(request.reason))
        connection = context.peer()
        address = connection.rpartition(":")[0]
        try:
            if self.calls >= self._max_calls:
                raise LimitExceeded("streams", f"the node has {self.calls} calls open, its limit")
            open_here = self._per_connection[connection]
            if open_here >= self._max_per_connection:
                raise LimitExceeded(
                    "streams_per_connection",
                    f"this connection has {open_here} calls open, the limit per connection",
                )
            if not open_here:
                self.connections.admit(address)
        except LimitExceeded as err:
            self._count(err)
            await abort(context, err)
            raise  # not reached: abort raises
        self.calls += 1
        self._per_connection[connection] = open_here + 1

        def release(_context) -> None:
            self.calls -= 1
            if drop(self._per_connection, connection):
                self.connections.release(address)

        context.add_done_callback(release)


def _tolerant(deserialize: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def parse(raw: bytes) -> object:
        try:
            return deserialize(raw)
        except Exception as exc:
            return Malformed("request", exc)

    return parse
