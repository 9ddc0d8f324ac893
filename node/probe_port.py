"""The node's probe port: liveness answered by threads of its own (issue 24).

The gRPC server that carries data, replication and recovery runs on the node's asyncio
loop; with a thousand pchannels on a loaded machine that loop can be busy for longer than
the coord's probe deadline, and a healthy node was declared lost because of its own work
(and the failover that followed made the next probe later still). The probe port is a
separate, synchronous gRPC server with two worker threads: a Ping is answered as soon as
the GIL is free (Python hands it over every few ms), whatever the loop is doing.

Alive is not serving, though: a loop wedged for good would keep answering pings. So a
task on the loop stamps the time every `TURN_S`, and each Ping reports how long ago the
loop last turned; the coord counts a ping with a stall beyond its bound as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc

from streamwal.proto import wire_pb2
from streamwal.transport import TransportConfig, bind, make_sync_server

TURN_S = 0.1  # how often the loop stamps that it turned


class ProbePort:
    """Serves StreamingNodeProbeService.Ping on `listen` from two threads of its own."""

    def __init__(self, node_id: int, transport: TransportConfig | None = None) -> None:
        self.node_id = node_id
        self.transport = transport
        self.port = 0
        self._turned = time.monotonic()
        self._server: grpc.Server | None = None
        self._stamp: asyncio.Task | None = None

    def _ping(self, _request, _context) -> wire_pb2.PingResponse:
        stall = max(0.0, time.monotonic() - self._turned - TURN_S)
        return wire_pb2.PingResponse(
            server_id=self.node_id,
            wall_time_ms=time.time_ns() // 1_000_000,
            loop_stall_ms=min(round(stall * 1000), 2**32 - 1),
        )

    async def start(self, listen: str) -> None:
        """Listen on `listen` (HOST:PORT; port 0 picks one). Raises OSError if it cannot."""
        server = make_sync_server(2, "probe")
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "streamwal.wire.StreamingNodeProbeService",
                    {
                        "Ping": grpc.unary_unary_rpc_method_handler(
                            self._ping,
                            wire_pb2.PingRequest.FromString,
                            wire_pb2.PingResponse.SerializeToString,
                        )
                    },
                )
            ]
        )
        try:
            self.port = bind(server, listen, self.transport)
        except RuntimeError as exc:
            raise OSError(str(exc)) from None
        if self.port == 0:
            raise OSError(f"cannot bind {listen}")
        server.start()
        self._server = server
        self._stamp = asyncio.create_task(self._stamp_turns(), name="probe-stamp")

    async def _stamp_turns(self) -> None:
        while True:
            self._turned = time.monotonic()
            await asyncio.sleep(TURN_S)

    async def stop(self) -> None:
        if self._stamp is not None:
            self._stamp.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stamp
        if self._server is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._server.stop(0).wait, 2.0)
