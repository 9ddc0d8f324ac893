"""The coord's broadcast service: gRPC in, `Broadcaster` calls, typed errors out."""

from __future__ import annotations

from grpc import aio

from streamwal.coord.broadcaster import Broadcaster
from streamwal.errors import StreamingError
from streamwal.grpc_errors import abort
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import broadcast_pb2_grpc as bpbg


class BroadcastService(bpbg.StreamingCoordBroadcastServiceServicer):
    """Errors travel as a gRPC status plus the StreamingError in `streaming-error-bin`."""

    def __init__(self, broadcaster: Broadcaster) -> None:
        self.broadcaster = broadcaster

    async def _call(self, context: aio.ServicerContext, call):
        try:
            return await call
        except StreamingError as err:
            await abort(context, err)

    async def Broadcast(self, request, context):
        return await self._call(context, self.broadcaster.broadcast(request))

    async def Ack(self, request, context):
        await self._call(context, self.broadcaster.ack(request.broadcast_id, request.vchannel))
        return bpb.BroadcastAckResponse()

    async def ListBroadcasts(self, request, context):
        tasks = self.broadcaster.kept(request.include_tombstones)
        return bpb.ListBroadcastsResponse(tasks=tasks)

    async def WaitResourceKey(self, request, context):
        until_all = request.until == bpb.WAIT_UNTIL_ACK_ALL
        await self._call(
            context,
            self.broadcaster.wait_resource_key(request.key.domain, request.key.key, until_all),
        )
        return bpb.WaitResourceKeyResponse()
