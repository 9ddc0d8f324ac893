"""The coord's thin gRPC adapter to streaming nodes' manager service.

One channel per node, to its internal listener (found from the node's gRPC address by
`transport.internal_address`), built by `streamwal.transport`. Every call has a deadline so a dead
or hung node can never stall the coord; failures come back as typed errors:
`StreamingError` subclasses when the node answered with one (trailing metadata
`streaming-error-bin`), `Unavailable` when it did not answer at all. (The client's
NodeClient has no per-call deadlines, which the coord needs; hence these few stubs.)
"""

from __future__ import annotations

import time

import grpc
from grpc import aio

from streamwal import transport
from streamwal.grpc_errors import from_rpc_error
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg


class NodeLinks:
    """Manager-service stubs for every node the coord knows, created lazily."""

    def __init__(self, config: transport.TransportConfig | None = None) -> None:
        self._config = config
        self._channels: dict[str, aio.Channel] = {}
        # per address: the manager service's stub and the replication service's (Fence)
        self._stubs: dict[
            str, tuple[pbg.StreamingNodeManagerServiceStub, pbg.StreamingNodeReplicationServiceStub]
        ] = {}
        self._retired: list[aio.Channel] = []
        self._replaced: dict[str, float] = {}

    async def _stub(self, address: str, replication: bool, timeout: float):
        stubs = self._stubs.get(address)
        if stubs is None:
            internal = await transport.internal_address(address, self._config, timeout)
            stubs = self._stubs.get(address)  # another call may have made it meanwhile
        if stubs is None:
            channel = transport.make_channel(internal, self._config)
            self._channels[address] = channel
            stubs = self._stubs[address] = (
                pbg.StreamingNodeManagerServiceStub(channel),
                pbg.StreamingNodeReplicationServiceStub(channel),
            )
        return stubs[1] if replication else stubs[0]

    async def _call(
        self, address: str, method: str, request, timeout: float, replication: bool = False
    ):
        try:
            stub = await self._stub(address, replication, timeout)
            return await getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            await self._drop_if_failing(address)
            raise from_rpc_error(err) from None

    async def _drop_if_failing(self, address: str) -> None:
        """Replace a node's channel that is in TRANSIENT_FAILURE: gRPC's reconnect backoff
        (1 s, growing) would hide a restarted node for seconds -- long enough to declare it
        lost. A fresh channel connects on the next call. The old one is not closed before
        `close()`: closing would cancel calls still running on it (at most one replacement
        per address and second, so an outage leaves few behind)."""
        channel = self._channels.get(address)
        if channel is None:
            return
        if channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        now = time.monotonic()
        if now - self._replaced.get(address, 0.0) < 1.0:
            return
        self._replaced[address] = now
        self._stubs.pop(address, None)
        self._retired.append(self._channels.pop(address))

    async def assign(
        self,
        address: str,
        name: str,
        term: int,
        timeout: float,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
        retention: pb.RetentionPolicy | None = None,
    ) -> None:
        """Assign `name` at `term`; the node first copies what it lacks from `catch_up_from`.

        With `replica_set` the node leads or follows under `term` (replication); with
        `retention` it applies that policy (else it keeps the pchannel's current one)."""
        request = pb.StreamingNodeManagerAssignRequest(
            pchannel=pb.PChannelInfo(name=name, term=term),
            catch_up_from=catch_up_from,
            min_next_offset=min_next_offset,
            replica_set=replica_set,
            accept_data_loss=accept_data_loss,
            retention=retention,
        )
        await self._call(address, "Assign", request, timeout)

    async def fence(self, address: str, name: str, term: int, timeout: float) -> pb.FenceResponse:
        """Raise `name`'s accepted term on the node to `term`; returns its log's end."""
        request = pb.FenceRequest(pchannel=pb.PChannelInfo(name=name, term=term))
        return await self._call(address, "Fence", request, timeout, replication=True)

    async def remove(self, address: str, name: str, term: int, timeout: float) -> None:
        request = pb.StreamingNodeManagerRemoveRequest(
            pchannel=pb.PChannelInfo(name=name, term=term)
        )
        await self._call(address, "Remove", request, timeout)

    async def collect_status(
        self, address: str, timeout: float
    ) -> pb.StreamingNodeManagerCollectStatusResponse:
        request = pb.StreamingNodeManagerCollectStatusRequest()
        return await self._call(address, "CollectStatus", request, timeout)

    async def close(self) -> None:
        for channel in [*self._channels.values(), *self._retired]:
            await channel.close()
        self._channels.clear()
        self._retired.clear()
        self._stubs.clear()
