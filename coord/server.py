"""The coord's gRPC face: AssignmentDiscover, component state, and channel management.

Servicers are thin: they translate requests into `Coordinator` calls and StreamingErrors
into a gRPC status plus the serialized error in trailing metadata (`streaming-error-bin`),
the same convention the nodes use, so one client-side decoder serves both.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from contextlib import suppress

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from streamwal import transport
from streamwal.coord import discovery
from streamwal.coord.broadcast_service import BroadcastService
from streamwal.coord.coordinator import CoordConfig, Coordinator
from streamwal.coord.meta_store import LocalMetaStore
from streamwal.coord.pinger import Pinger
from streamwal.errors import InvalidArgument, StreamingError
from streamwal.grpc_errors import abort as _abort
from streamwal.proto import broadcast_pb2_grpc as bpbg
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.proto import milvus_pb2 as mpb
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg

log = logging.getLogger("streamwal.coord.server")

ROLE = "streamingcoord"


class AssignmentService(pbg.StreamingCoordAssignmentServiceServicer):
    """Pushes the full assignment at once and then on every change, in version order."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    async def AssignmentDiscover(self, request_iterator, context):
        metadata = dict(context.invocation_metadata() or ())
        queue = self.coord.hub.subscribe(
            deltas=metadata.get(discovery.DELTAS) == "deltas",
            since=discovery.parse_version(metadata.get(discovery.RESUME_FROM)),
        )
        closed = asyncio.Event()

        async def read_commands() -> None:
            try:
                async for request in request_iterator:
                    kind = request.WhichOneof("command")
                    if kind == "report_error":
                        self.coord.report_error(
                            request.report_error.pchannel, request.report_error.err
                        )
                    elif kind == "close":
                        break
            except (aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                closed.set()
                queue.put_nowait(None)

        reader = asyncio.create_task(read_commands())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            if closed.is_set():
                yield pb.AssignmentDiscoverResponse(close=pb.CloseAssignmentDiscoverResponse())
        finally:
            self.coord.hub.unsubscribe(queue)
            reader.cancel()
            with suppress(asyncio.CancelledError):
                await reader


class StateService(pbg.StreamingCoordStateServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    async def GetComponentStates(self, request, context):
        return mpb.ComponentStates(
            state=mpb.ComponentInfo(
                nodeID=self.coord.incarnation, role=ROLE, state_code=mpb.StateCode.Healthy
            ),
            status=mpb.Status(),
        )


class ChannelService(cpbg.StreamingCoordChannelServiceServicer):
    """Seed 001's channel management, plus node draining."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    async def _call(self, context, fn, *args):
        try:
            return await fn(*args)
        except StreamingError as err:
            await _abort(context, err)

    async def CreateChannels(self, request, context):
        names = await self._call(
            context,
            self.coord.create_channels,
            request.owner,
            request.num_channels,
            request.prefix,
            request.replicas,
            request.allow_data_loss,
            list(request.names),
            request.retention if request.HasField("retention") else None,
        )
        return cpb.CreateChannelsResponse(channel_names=names)

    async def DestroyChannels(self, request, context):
        if not request.channel_names:
            await _abort(context, InvalidArgument("no channel names given"))
        await self._call(context, self.coord.destroy_channels, list(request.channel_names))
        return cpb.DestroyChannelsResponse()

    async def DescribeChannels(self, request, context):
        async def describe():
            return self.coord.describe(list(request.channel_names))

        return cpb.DescribeChannelsResponse(descriptions=await self._call(context, describe))

    async def DrainNode(self, request, context):
        await self._call(context, self.coord.drain, request.server_id, request.undrain)
        return cpb.DrainNodeResponse()

    async def AcceptDataLoss(self, request, context):
        await self._call(context, self.coord.accept_data_loss, request.channel_name)
        return cpb.AcceptDataLossResponse()

    async def ListNodes(self, request, context):
        return cpb.ListNodesResponse(nodes=self.coord.nodes())


def parse_nodes(text: str) -> dict[int, str]:
    """`ID=HOST:PORT[,...]` -> {id: address}; bad input raises InvalidArgument."""
    nodes: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        node_id, sep, address = part.partition("=")
        if not sep or not node_id.strip().isdigit() or ":" not in address:
            raise InvalidArgument(f"bad node {part!r}: expected ID=HOST:PORT")
        if int(node_id) in nodes:
            raise InvalidArgument(f"node id {node_id} given twice")
        nodes[int(node_id)] = address.strip()
    return nodes


async def start_grpc(
    coord: Coordinator,
    listen: str,
    channel_service: bool = True,
    security: transport.TransportConfig | None = None,
) -> tuple[aio.Server, health.aio.HealthServicer, int]:
    """Serve the coord's gRPC services for `coord` on `listen`; returns server, health, port.

    The Kubernetes operator serves the same services beside Kopf, without the channel
    service (there, PChannel resources are created with kubectl, not through the coord).
    """
    server = transport.make_server(security)
    pbg.add_StreamingCoordAssignmentServiceServicer_to_server(AssignmentService(coord), server)
    pbg.add_StreamingCoordStateServiceServicer_to_server(StateService(coord), server)
    if channel_service:
        cpbg.add_StreamingCoordChannelServiceServicer_to_server(ChannelService(coord), server)
    bpbg.add_StreamingCoordBroadcastServiceServicer_to_server(
        BroadcastService(coord.broadcaster), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = transport.bind(server, listen, security)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, port


def serve_metrics(coord: Coordinator, address: str) -> int:
    """Serve `coord`'s Prometheus registry on HOST:PORT (port 0: any); returns the port."""
    host, _, mport = address.rpartition(":")
    try:
        http, _thread = start_http_server(
            int(mport), addr=host or "127.0.0.1", registry=coord.metrics.registry
        )
    except OSError as exc:
        raise transport.StartupError(
            f"cannot serve metrics on {address} (--metrics): {exc.strerror or exc}"
        ) from None
    return http.server_port


async def serve(
    listen: str,
    meta_dir: str,
    config: CoordConfig,
    metrics_address: str | None = None,
    forget_missing_meta: bool = False,
    security: transport.TransportConfig | None = None,
) -> None:
    """Run a coord until SIGTERM / SIGINT; `security`: its server's TLS and access rules.
    What keeps it from starting (a port in use, an unusable meta dir) is a StartupError."""
    transport.check_bindable(listen, "--listen")
    if metrics_address:
        transport.check_bindable(metrics_address, "--metrics")
    try:
        store = LocalMetaStore(meta_dir, forget_missing=forget_missing_meta)
    except OSError as exc:
        raise transport.StartupError(
            f"cannot use the meta dir {meta_dir} (--meta-dir): {exc.strerror or exc}"
        ) from None
    coord = Coordinator(store, config, pinger=Pinger(config.probe_interval, config.max_loop_stall))
    await coord.start()
    server, health_servicer, port = await start_grpc(coord, listen, security=security)
    if metrics_address:
        serve_metrics(coord, metrics_address)
    log.info("coord serving", extra={"listen": listen, "port": port, "meta_dir": meta_dir})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("coord stopping")
    await health_servicer.enter_graceful_shutdown()
    coord.hub.close_all()
    await server.stop(grace=1.0)
    await coord.stop()
    await store.close()
