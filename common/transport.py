"""The one place where gRPC servers and channels are built.

Every server and client channel in streamwal comes from `make_server` / `make_channel`,
so transport security is configured once: plaintext by default, TLS when a certificate
is configured, mutual TLS when a CA is configured on the server, and per-service
authorization (only the coord's identity may call the node manager service) on top of
mTLS — all without touching call sites. Configuration comes from `TransportConfig`,
which reads STREAMWAL_TLS_* environment variables by default.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from streamwal.proto import wire_pb2

# What a client takes: a node's answers and records. A node takes smaller requests (its
# --max-frame-size, node/grpc_limits.py); the per-message limit is the node's own.
MAX_FRAME_BYTES = 256 * 1024 * 1024
CONNECT_TIMEOUT_MS = 2000
_OPTIONS = [
    ("grpc.max_send_message_length", MAX_FRAME_BYTES),
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # A restarted node is back within a second or two: retry connecting at least that
    # often instead of gRPC's default backoff, which grows to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # gRPC reads this one as the least time a connection attempt gets to finish its
    # HTTP/2 handshake, not as a backoff. At 100 ms a node that stalled that long (a
    # CPU-throttled pod, a busy 2-core machine) failed new calls with UNAVAILABLE
    # "timed out before receiving SETTINGS frame". A refused connection still fails
    # at once and is retried after the backoff above.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
]
_SERVER_OPTIONS = [
    *_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
]
MANAGER_SERVICE = "/milvus.proto.streaming.StreamingNodeManagerService/"


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass(frozen=True)
class TransportConfig:
    """TLS material (file paths) and who may manage nodes. Empty means plaintext."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    # Common names allowed to call StreamingNodeManagerService when mTLS is on.
    manager_identities: tuple[str, ...] = field(default_factory=tuple)
    # The name clients check servers' certificates for, instead of the dialled host: on
    # Kubernetes nodes are dialled by pod IP, which no certificate issued ahead can carry.
    server_name: str | None = None

    @staticmethod
    def from_env() -> TransportConfig:
        names = os.environ.get("STREAMWAL_TLS_MANAGER_IDENTITIES", "")
        return TransportConfig(
            cert=os.environ.get("STREAMWAL_TLS_CERT") or None,
            key=os.environ.get("STREAMWAL_TLS_KEY") or None,
            ca=os.environ.get("STREAMWAL_TLS_CA") or None,
            manager_identities=tuple(n for n in names.split(",") if n),
            server_name=os.environ.get("STREAMWAL_TLS_SERVER_NAME") or None,
        )

    @property
    def tls(self) -> bool:
        return bool(self.cert and self.key) or bool(self.ca)


class _ManagerAuthorization(aio.ServerInterceptor):
    """Rejects node-manager calls from peers whose certificate is not a coord's."""

    def __init__(self, identities: tuple[str, ...]) -> None:
        self._identities = {i.encode() for i in identities}

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if not details.method.startswith(MANAGER_SERVICE) or handler is None:
            return handler
        identities = self._identities

        async def deny(request, context: aio.ServicerContext):
            peer = context.auth_context().get("x509_common_name", [])
            if not identities.intersection(peer):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "only the coord may call StreamingNodeManagerService",
                )
            return await handler.unary_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(
            deny,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def make_server(
    config: TransportConfig | None = None,
    options: Sequence[tuple[str, int]] = (),
    interceptors: Sequence[aio.ServerInterceptor] = (),
) -> aio.Server:
    """A grpc.aio server; call `bind(server, address, config)` to listen. `options` replace
    the defaults of the same name (a node's limits); `interceptors` run after the
    authorization check."""
    config = config or TransportConfig.from_env()
    chain = []
    if config.ca and config.manager_identities:
        chain.append(_ManagerAuthorization(config.manager_identities))
    chain += interceptors
    replaced = {name for name, _ in options}
    merged = [o for o in _SERVER_OPTIONS if o[0] not in replaced] + list(options)
    return aio.server(options=merged, interceptors=chain)


def bind(server: aio.Server, address: str, config: TransportConfig | None = None) -> int:
    """Listen on `address` (HOST:PORT, port 0 picks one); returns the bound port."""
    config = config or TransportConfig.from_env()
    if not config.tls:
        return server.add_insecure_port(address)
    creds = grpc.ssl_server_credentials(
        [(_read(config.key), _read(config.cert))],
        root_certificates=_read(config.ca),
        require_client_auth=bool(config.ca),
    )
    return server.add_secure_port(address, creds)


DESCRIBE = "/streamwal.wire.StreamingNodeInfoService/Describe"
DESCRIBE_TIMEOUT_S = 5.0


async def internal_address(
    address: str, config: TransportConfig | None = None, timeout: float = DESCRIBE_TIMEOUT_S
) -> str:
    """The address of the node's internal listener (manager and replication services),
    given the gRPC address clients use: the node's Describe names the internal port on
    the same host; 0 (a node run with --internal-listen shared) means that same address.

    Asked at every new channel rather than remembered, so a node restarted on another
    internal port is found again by the caller's ordinary reconnect."""
    channel = make_channel(address, config)
    try:
        answer = await channel.unary_unary(
            DESCRIBE,
            request_serializer=wire_pb2.DescribeNodeRequest.SerializeToString,
            response_deserializer=wire_pb2.DescribeNodeResponse.FromString,
        )(wire_pb2.DescribeNodeRequest(), timeout=timeout)
    finally:
        await channel.close()
    if not answer.internal_port:
        return address
    return f"{address.rpartition(':')[0]}:{answer.internal_port}"


async def make_internal_channel(address: str, config: TransportConfig | None = None) -> aio.Channel:
    """A channel to the internal listener of the node clients reach at `address`."""
    return make_channel(await internal_address(address, config), config)


def make_channel(address: str, config: TransportConfig | None = None) -> aio.Channel:
    """A grpc.aio channel to `address`, secured as configured."""
    config = config or TransportConfig.from_env()
    if not config.tls:
        return aio.insecure_channel(address, options=_OPTIONS)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(config.ca),
        private_key=_read(config.key),
        certificate_chain=_read(config.cert),
    )
    options = list(_OPTIONS)
    if config.server_name:
        options.append(("grpc.ssl_target_name_override", config.server_name))
    return aio.secure_channel(address, creds, options=options)
