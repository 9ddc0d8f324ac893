"""Broadcast through the coord (seed 002's WALAccesser.Broadcast), asyncio and blocking.

One message goes to many vchannels, possibly on different pchannels and nodes. The coord
records it durably first, then appends it to every vchannel (each copy carries `_vc` and
the broadcast id in `_bid`); `append` returns once every copy is durable. Resource keys
are held until the consuming side has acked the broadcast on every vchannel; a broadcast
whose key conflicts with a holder is refused at once with `ResourceKeyConflict`.

    async with BroadcastClient("127.0.0.1:19500") as b:
        result = await b.append(b"drop c1", ["pchannel_0_v1", "pchannel_1_v1"],
                                [ResourceKey("collection", "c1")])
        ...                                     # consumers handle it, then:
        await b.ack(result.broadcast_id, "pchannel_0_v1")
        await b.block_until_resource_key_ack_all(ResourceKey("collection", "c1"))

Every call retries while the coord is unreachable (a restart), within its timeout: an
append is retried under the same request id, so it is recorded once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from streamwal.client.append import AppendResult
from streamwal.client.sync import _Portal
from streamwal.errors import Unavailable
from streamwal.grpc_errors import from_rpc_error, from_trailing
from streamwal.ids import decode_offset
from streamwal.message import PROP_TYPE, ResourceKey
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import broadcast_pb2_grpc as bpbg
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig, make_channel

__all__ = ["BroadcastAppendResult", "BroadcastClient", "ResourceKey", "SyncBroadcastClient"]

RETRY_INTERVAL = 0.2


@dataclass(frozen=True)
class BroadcastAppendResult:
    """The broadcast's id and, per vchannel, where its copy landed (the accessor's
    AppendResult: message id, i.e. offset, and time tick)."""

    broadcast_id: int
    results: dict[str, AppendResult]


def to_message(
    message: Any, properties: Mapping[str, str] | None = None, msg_type: int | None = None
) -> pb.Message:
    """bytes, a `pb.Message`, or anything with `payload` (and `properties`, `msg_type`)."""
    if isinstance(message, pb.Message):
        out = pb.Message()
        out.CopyFrom(message)
    elif isinstance(message, bytes | bytearray | memoryview):
        out = pb.Message(payload=bytes(message))
    else:
        out = pb.Message(
            payload=bytes(message.payload), properties=dict(getattr(message, "properties", {}))
        )
        msg_type = msg_type if msg_type is not None else getattr(message, "msg_type", None)
    out.properties.update(properties or {})
    if msg_type is not None:
        out.properties[PROP_TYPE] = str(int(msg_type))
    return out


def _key(key: ResourceKey) -> bpb.ResourceKey:
    return bpb.ResourceKey(domain=key.domain, key=key.key, shared=key.shared)


def _retryable(exc: grpc.RpcError) -> bool:
    """The coord could not be reached (down or restarting): the same call may be resent."""
    code = exc.code() if hasattr(exc, "code") else None
    return code == grpc.StatusCode.UNAVAILABLE and from_trailing(exc.trailing_metadata()) is None


class BroadcastClient:
    """The coord's broadcast service; give `coord` (HOST:PORT) or an open `channel`."""

    def __init__(
        self,
        coord: str | None = None,
        *,
        channel: aio.Channel | None = None,
        transport: TransportConfig | None = None,
        timeout: float = 60.0,
    ) -> None:
        if (coord is None) == (channel is None):
            raise ValueError("give either coord= or channel=")
        self._own = channel is None
        self._channel = channel or make_channel(coord, transport)
        self._stub = bpbg.StreamingCoordBroadcastServiceStub(self._channel)
        self.timeout = timeout

    async def _call(self, method, request, timeout: float | None):
        """`method(request)`, resent while the coord is unreachable, within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            try:
                return await method(request, timeout=remaining)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                left = None if deadline is None else deadline - time.monotonic()
                if not _retryable(exc) or (left is not None and left <= RETRY_INTERVAL):
                    raise err from None
            await asyncio.sleep(RETRY_INTERVAL)

    async def append(
        self,
        message: Any,
        vchannels: Sequence[str],
        resource_keys: Sequence[ResourceKey] = (),
        *,
        properties: Mapping[str, str] | None = None,
        msg_type: int | None = None,
        timeout: float | None = -1,
    ) -> BroadcastAppendResult:
        """Append `message` to every vchannel; returns once every copy is durable.

        Raises ResourceKeyConflict (a key is held), ChannelNotExist (unknown vchannel),
        InvalidArgument, or the last error when `timeout` (default: the client's) ran out
        -- the coord keeps going, and the broadcast still lands everywhere.
        """
        request = bpb.BroadcastRequest(
            message=to_message(message, properties, msg_type),
            vchannels=list(vchannels),
            resource_keys=[_key(k) for k in resource_keys],
            request_id=uuid.uuid4().hex,
        )
        reply = await self._call(self._stub.Broadcast, request, self._timeout(timeout))
        return BroadcastAppendResult(
            reply.broadcast_id,
            {
                r.vchannel: AppendResult(r.vchannel, decode_offset(r.message_id.id), r.time_tick)
                for r in reply.results
            },
        )

    async def ack(self, broadcast_id: int, vchannel: str, *, timeout: float | None = -1) -> None:
        """The broadcast was handled on `vchannel` (idempotent). Raises BroadcastNotFound
        for an unknown id, InvalidArgument for a vchannel that is not one of its targets."""
        request = bpb.BroadcastAckRequest(broadcast_id=broadcast_id, vchannel=vchannel)
        await self._call(self._stub.Ack, request, self._timeout(timeout))

    async def block_until_resource_key_ack_once(
        self, key: ResourceKey, *, timeout: float | None = None
    ) -> None:
        """Until every broadcast holding `key` now was acked on at least one vchannel."""
        await self._wait(key, bpb.WAIT_UNTIL_ACK_ONCE, timeout)

    async def block_until_resource_key_ack_all(
        self, key: ResourceKey, *, timeout: float | None = None
    ) -> None:
        """Until every broadcast holding `key` now was acked everywhere (it released it)."""
        await self._wait(key, bpb.WAIT_UNTIL_ACK_ALL, timeout)

    async def _wait(self, key: ResourceKey, until: int, timeout: float | None) -> None:
        request = bpb.WaitResourceKeyRequest(key=_key(key), until=until)
        try:
            await self._call(self._stub.WaitResourceKey, request, timeout)
        except Unavailable as err:
            if "DEADLINE_EXCEEDED" in err.cause:
                raise TimeoutError(f"resource key {key} still held after {timeout}s") from None
            raise

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout == -1 else timeout

    async def close(self) -> None:
        if self._own:
            await self._channel.close()

    async def __aenter__(self) -> BroadcastClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class SyncBroadcastClient:
    """`BroadcastClient`, blocking (a private event-loop thread runs the asyncio one)."""

    def __init__(self, coord: str, **options) -> None:
        self._portal = _Portal()

        async def make() -> BroadcastClient:
            return BroadcastClient(coord, **options)

        self._client = self._portal.call(make())

    def append(
        self,
        message: Any,
        vchannels: Sequence[str],
        resource_keys: Sequence[ResourceKey] = (),
        **options,
    ) -> BroadcastAppendResult:
        return self._portal.call(self._client.append(message, vchannels, resource_keys, **options))

    def ack(self, broadcast_id: int, vchannel: str, **options) -> None:
        self._portal.call(self._client.ack(broadcast_id, vchannel, **options))

    def block_until_resource_key_ack_once(self, key: ResourceKey, **options) -> None:
        self._portal.call(self._client.block_until_resource_key_ack_once(key, **options))

    def block_until_resource_key_ack_all(self, key: ResourceKey, **options) -> None:
        self._portal.call(self._client.block_until_resource_key_ack_all(key, **options))

    def close(self) -> None:
        try:
            self._portal.call(self._client.close())
        finally:
            self._portal.stop()

    def __enter__(self) -> SyncBroadcastClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
