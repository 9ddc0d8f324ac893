"""The one place where gRPC servers and channels are built.

Every server and client channel in streamwal comes from `make_server` / `make_channel`,
so transport security is configured once: plaintext by default, TLS when a certificate
is configured, mutual TLS when a CA is configured on the server, and on top of mTLS
every call checked against the server's access rules (common/access.py: identities from
the client certificate, roles, per-pchannel permissions) — all without touching call
sites. Configuration comes from `TransportConfig`,
which reads STREAMWAL_TLS_* environment variables by default.
"""

from __future__ import annotations

import inspect
import os
import socket
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import grpc
from grpc import aio

from streamwal import access
from streamwal.proto import streaming_pb2, wire_pb2

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
    # A restarted node is back within a second or two: retry connecting at least every
    # 250 ms instead of gRPC's default backoff, which grows to two minutes. At a 1 s cap
    # the coord saw a node restarted after a 2-5 s outage 0.8-1.3 s late (the next
    # attempt was that far away), and while it looked dead the loss rule held back the
    # failover of another node (issue 22's grace + 1 s missed); a refused attempt costs
    # one SYN.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
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


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


NO_RULES = (
    "mutual TLS (STREAMWAL_TLS_CA) needs an --access-file: without one every certificate "
    "of the CA could call everything"
)


@dataclass(frozen=True)
class TransportConfig:
    """TLS material (file paths) and, on a server, who may call what. Empty: plaintext."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    # The name clients check servers' certificates for, instead of the dialled host: on
    # Kubernetes nodes are dialled by pod IP, which no certificate issued ahead can carry.
    server_name: str | None = None
    # A server's access rules (--access-file, common/access.py): every call is checked
    # against the caller's certificate. Required with mutual TLS (`make_server`).
    access: access.Access | None = None

    @staticmethod
    def from_env() -> TransportConfig:
        return TransportConfig(
            cert=os.environ.get("STREAMWAL_TLS_CERT") or None,
            key=os.environ.get("STREAMWAL_TLS_KEY") or None,
            ca=os.environ.get("STREAMWAL_TLS_CA") or None,
            server_name=os.environ.get("STREAMWAL_TLS_SERVER_NAME") or None,
        )

    @property
    def tls(self) -> bool:
        return bool(self.cert and self.key) or bool(self.ca)

    def for_server(self, access_file: str | None) -> TransportConfig:
        """This configuration with the rules of `access_file`, for a server. ValueError
        (one line) when security would be half on: rules without client certificates to
        apply them to, or client certificates without rules (every certificate of the CA
        could then manage nodes). An unreadable or wrong file: access.AccessError."""
        if access_file and not (self.ca and self.cert and self.key):
            raise ValueError(
                "--access-file needs mutual TLS: set STREAMWAL_TLS_CA, STREAMWAL_TLS_CERT "
                "and STREAMWAL_TLS_KEY"
            )
        if self.ca and not access_file:
            raise ValueError(NO_RULES)
        if access_file:
            return replace(self, access=access.load(access_file))
        return self


def _certificate_names(context: aio.ServicerContext) -> list[str]:
    """The caller's verified certificate's CN and SANs (none without mutual TLS)."""
    auth = context.auth_context()
    found = [*auth.get("x509_common_name", []), *auth.get("x509_subject_alternative_name", [])]
    return [n.decode(errors="replace") for n in found]


_HEADERS = {
    "create-producer-bin": streaming_pb2.CreateProducerRequest,
    "create-consumer-bin": streaming_pb2.CreateConsumerRequest,
}


def _pchannels(where: str, request, context: aio.ServicerContext) -> list[str] | None:
    """The pchannels a call names (`access.Method.pchannels`): [] when it names none,
    None when they cannot be read (a missing or garbled header, a malformed request):
    denied, as anything unclear is."""
    if not where:
        return []
    if where.startswith("header:"):
        key = where.removeprefix("header:")
        for k, v in context.invocation_metadata() or ():
            if k == key:
                try:
                    return [_HEADERS[key].FromString(v).pchannel.name]
                except Exception:
                    return None
        return None
    value = request
    for part in where.split("."):
        value = getattr(value, part, None)
    if isinstance(value, str):
        return [value]
    if value is None or not all(isinstance(v, str) for v in value):
        return None
    return list(value)


class _Authorization(aio.ServerInterceptor):
    """Every call is checked against the access rules (common/access.py): the caller's
    certificate names, the method's action, the pchannels it names. A method the rules
    do not know is denied (fail closed)."""

    def __init__(self, rules: access.Access) -> None:
        self._rules = rules

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = access.METHODS.get(details.method)
        rules = self._rules

        async def check(request, context: aio.ServicerContext) -> None:
            names = _certificate_names(context)
            pchannels = _pchannels(method.pchannels, request, context) if method else None
            if pchannels is None or method is None or not rules.allowed(names, method, pchannels):
                who = ", ".join(names) or "no certificate"
                on = f" on {', '.join(pchannels)}" if pchannels else ""
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{who} may not call {details.method}{on}",
                )

        return _checked(handler, check)


def _checked(handler: grpc.RpcMethodHandler, check) -> grpc.RpcMethodHandler:
    """`handler` with `check(request or None, context)` run before it."""
    kind = (
        f"{'stream' if handler.request_streaming else 'unary'}_"
        f"{'stream' if handler.response_streaming else 'unary'}"
    )
    behavior = getattr(handler, kind)
    first = (lambda r: None) if handler.request_streaming else (lambda r: r)
    if inspect.isasyncgenfunction(behavior):

        async def checked(request, context):
            await check(first(request), context)
            async for response in behavior(request, context):
                yield response

    else:

        async def checked(request, context):
            await check(first(request), context)
            return await behavior(request, context)

    return getattr(grpc, f"{kind}_rpc_method_handler")(
        checked, handler.request_deserializer, handler.response_serializer
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
    if config.ca and config.access is None:
        raise ValueError(NO_RULES)
    chain: list[aio.ServerInterceptor] = []
    if config.access is not None:
        chain.append(_Authorization(config.access))
    chain += interceptors
    replaced = {name for name, _ in options}
    merged = [o for o in _SERVER_OPTIONS if o[0] not in replaced] + list(options)
    return aio.server(options=merged, interceptors=chain)


def make_sync_server(workers: int, name: str) -> grpc.Server:
    """A blocking gRPC server answered by `workers` threads of its own (a node's probe
    port: no event loop in the way); `bind` it like the others."""
    executor = futures.ThreadPoolExecutor(workers, thread_name_prefix=name)
    return grpc.server(executor, options=_SERVER_OPTIONS)


def bind(
    server: aio.Server | grpc.Server, address: str, config: TransportConfig | None = None
) -> int:
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


async def describe_node(
    address: str, config: TransportConfig | None = None, timeout: float = DESCRIBE_TIMEOUT_S
) -> wire_pb2.DescribeNodeResponse:
    """The Describe answer of the node clients reach at `address` (grpc.RpcError if none)."""
    channel = make_channel(address, config)
    try:
        return await channel.unary_unary(
            DESCRIBE,
            request_serializer=wire_pb2.DescribeNodeRequest.SerializeToString,
            response_deserializer=wire_pb2.DescribeNodeResponse.FromString,
        )(wire_pb2.DescribeNodeRequest(), timeout=timeout)
    finally:
        await channel.close()


def internal_of(address: str, answer: wire_pb2.DescribeNodeResponse) -> str:
    """The internal listener's address, from the node's gRPC address and its Describe: the
    internal port on the same host; 0 (a node run with --internal-listen shared) means
    that same address."""
    if not answer.internal_port:
        return address
    return f"{address.rpartition(':')[0]}:{answer.internal_port}"


async def internal_address(
    address: str, config: TransportConfig | None = None, timeout: float = DESCRIBE_TIMEOUT_S
) -> str:
    """The address of the node's internal listener (manager and replication services),
    given the gRPC address clients use (`internal_of`).

    Asked at every new channel rather than remembered, so a node restarted on another
    internal port is found again by the caller's ordinary reconnect."""
    return internal_of(address, await describe_node(address, config, timeout))


async def make_internal_channel(address: str, config: TransportConfig | None = None) -> aio.Channel:
    """A channel to the internal listener of the node clients reach at `address`."""
    return make_channel(await internal_address(address, config), config)


class StartupError(Exception):
    """A server (node, coord) cannot start as configured; the message is one line for
    the operator."""


def check_bindable(address: str, flag: str) -> None:
    """StartupError with the system's reason (in use, no such interface) when `address`
    cannot be bound; gRPC only says that it failed."""
    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        raise StartupError(f"cannot listen on {address} ({flag}): {exc.strerror or exc}") from None


class Closable(Protocol):
    async def close(self) -> None: ...


class Replaced:
    """Connections to a node replaced while calls may still run on them (a channel in
    TRANSIENT_FAILURE: a fresh one re-resolves the node's address and connects at once).
    Closing one at once would cancel those calls; keeping every one until shutdown
    leaked one per second of a node's outage. Each is closed once older than `linger`
    seconds, longer than any call's deadline; at most one replacement per address per
    `every` seconds."""

    def __init__(self, linger: float = 60.0, every: float = 1.0) -> None:
        self.linger = linger
        self.every = every
        self._old: list[tuple[float, Closable]] = []
        self._last: dict[str, float] = {}

    def due(self, address: str, now: float) -> bool:
        """Whether `address`'s connection may be replaced now (then it counts as done)."""
        if now - self._last.get(address, -self.every) < self.every:
            return False
        self._last[address] = now
        return True

    async def retire(self, connection: Closable, now: float) -> None:
        """Keep `connection` until it is old enough to close; close the ones that are."""
        self._old.append((now, connection))
        while self._old and now - self._old[0][0] >= self.linger:
            await self._old.pop(0)[1].close()

    async def close(self) -> None:
        for _, connection in self._old:
            await connection.close()
        self._old.clear()


# A channel of its own connection: gRPC shares connections (subchannels) between the
# channels a process opens to one address, so a channel made to replace one whose
# connection went dead would get that same connection back. After a network partition
# heals, a TCP connection that carried calls into it resends only as its retransmission
# backoff allows (seconds after 3-4 s of loss); a new connection is up at once.
_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


def make_channel(
    address: str, config: TransportConfig | None = None, own_connection: bool = False
) -> aio.Channel:
    """A grpc.aio channel to `address`, secured as configured; `own_connection`: on a
    connection no other channel shares (for channels replaced when theirs goes dead)."""
    config = config or TransportConfig.from_env()
    creds, options = _secure(config, own_connection)
    if creds is None:
        return aio.insecure_channel(address, options=options)
    return aio.secure_channel(address, creds, options=options)


def make_sync_channel(
    address: str, config: TransportConfig | None = None, own_connection: bool = False
) -> grpc.Channel:
    """A blocking gRPC channel to `address`, secured as configured (for threads that must
    not depend on an event loop: the coord's pings); `own_connection` as `make_channel`."""
    config = config or TransportConfig.from_env()
    creds, options = _secure(config, own_connection)
    if creds is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, creds, options=options)


def _secure(
    config: TransportConfig, own_connection: bool
) -> tuple[grpc.ChannelCredentials | None, list]:
    """A channel's credentials (None: plaintext) and options."""
    options = [*_OPTIONS, _OWN_CONNECTION] if own_connection else list(_OPTIONS)
    if not config.tls:
        return None, options
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(config.ca),
        private_key=_read(config.key),
        certificate_chain=_read(config.cert),
    )
    if config.server_name:
        options.append(("grpc.ssl_target_name_override", config.server_name))
    return creds, options
