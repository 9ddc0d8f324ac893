"""The client's view of who owns which pchannel, kept fresh from the coord's AssignmentDiscover.

The watcher asks for deltas (metadata `streamwal-discovery: deltas`, coord/discovery.py):
the coord pushes the full assignment once, then only what moved, each with a
`VersionPair` (global: coord incarnation, local: change counter); a coord that does not
know the option (the seed's) keeps pushing full tables, which are applied as ever. The
watcher keeps only the newest version it has seen -- a reconnect (to the same or a
restarted coord) may replay an older or equal view, which is ignored -- and reconnects
with a bounded backoff whenever the stream breaks, resuming from its version (the coord
sends the deltas since then when it still holds them, else the table). A delta that
does not apply to the version held breaks the stream, and the resume repairs it. Errors a
client hits on a node are reported back on the same stream (`report_error`), which
makes the coord re-check that pchannel at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from dataclasses import dataclass

import grpc
from grpc import aio

from streamwal.errors import ChannelNotExist, DataLoss, StreamingError, Unavailable
from streamwal.grpc_errors import from_trailing
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg
from streamwal.transport import TransportConfig, make_channel

log = logging.getLogger("streamwal.client.discovery")

# The coord's discovery options (gRPC metadata; coord/discovery.py reads the same keys).
DELTAS = "streamwal-discovery"
RESUME_FROM = "streamwal-discovery-from"

Version = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a pchannel is served: its owner node and the term to present there."""

    pchannel: str
    term: int
    server_id: int
    address: str

    def info(self) -> pb.PChannelInfo:
        return pb.PChannelInfo(name=self.pchannel, term=self.term)


class NoRoute(Unavailable):
    """No assignment for the pchannel arrived in time (coord down, or no live node)."""


def _pair(version: pb.VersionPair) -> Version:
    return (getattr(version, "global"), version.local)  # `global`: a Python keyword


def version_of(full: pb.FullStreamingNodeAssignmentWithVersion | pb.AssignmentDelta) -> Version:
    """A full assignment's version; a delta's base."""
    if isinstance(full, pb.AssignmentDelta):
        return _pair(full.base)
    return _pair(full.version)


def routes_of(
    full: pb.FullStreamingNodeAssignmentWithVersion | pb.AssignmentDelta,
) -> dict[str, Route]:
    """{pchannel: Route} of a full assignment (the coord publishes ASSIGNED channels only)
    or of what a delta (re)assigned."""
    groups = full.assigned if isinstance(full, pb.AssignmentDelta) else full.assignments
    return {
        c.name: Route(c.name, c.term, a.node.server_id, a.node.address)
        for a in groups
        for c in a.channels
    }


class AssignmentWatcher:
    """One AssignmentDiscover stream to the coord, reconnected on failure, newest view kept."""

    def __init__(
        self,
        coord: str,
        transport: TransportConfig | None = None,
        max_backoff: float = 1.0,
    ) -> None:
        self.coord = coord
        self._transport = transport
        self._max_backoff = max_backoff
        self.version: Version = (-1, -1)
        self.routes: dict[str, Route] = {}
        self._changed = asyncio.Event()  # replaced after every set: waiters see one change
        self._reports: asyncio.Queue[pb.AssignmentDiscoverRequest | None] | None = None
        self._task: asyncio.Task | None = None
        self._channel: aio.Channel | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def start(self, timeout: float = 10.0) -> AssignmentWatcher:
        """Connect and wait for the first full assignment (bounded)."""
        self._channel = make_channel(self.coord, self._transport)
        self._task = asyncio.create_task(self._run(), name="assignment-watcher")
        try:
            await asyncio.wait_for(self._first_view(), timeout)
        except TimeoutError:
            await self.close()
            raise Unavailable(
                f"coord {self.coord}: no assignment within {timeout}s (is the coord running?)"
            ) from None
        return self

    async def _first_view(self) -> None:
        while self.version == (-1, -1):
            await self._changed.wait()

    def route(self, pchannel: str) -> Route | None:
        return self.routes.get(pchannel)

    async def wait_route(
        self, pchannel: str, newer_than: Route | None = None, timeout: float | None = 10.0
    ) -> Route:
        """The pchannel's route once it exists (and has a term above `newer_than`'s).

        Raises NoRoute after `timeout` seconds; None waits until one arrives (a watch that
        runs beside the work, such as a routed producer's, not a caller's wait).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            route = self.routes.get(pchannel)
            if route is not None and (newer_than is None or route.term > newer_than.term):
                return route
            if deadline is None:
                await self._changed.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                have = f"term {route.term} on node {route.server_id}" if route else "no owner"
                raise NoRoute(
                    f"pchannel {pchannel!r}: no new assignment from coord {self.coord} "
                    f"within {timeout:.1f}s ({have})"
                )
            with suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def refusal(self, channel: str, timeout: float = 2.0) -> StreamingError | None:
        """The error a caller waiting for `channel`'s owner should get at once, as the
        coord describes it: DataLoss while its only copy lost acknowledged records (no
        owner comes until `channel accept-loss`), ChannelNotExist when the coord has no such
        pchannel (destroyed, never made, or a vchannel's name). None while it is only
        between owners, or when the coord does not answer: the caller's deadline bounds
        that wait, and a failover must not be cut short by a slow describe."""
        if self._channel is None:
            return None
        stub = cpbg.StreamingCoordChannelServiceStub(self._channel)
        request = cpb.DescribeChannelsRequest(channel_names=[channel])
        try:
            described = await stub.DescribeChannels(request, timeout=timeout)
        except aio.AioRpcError as err:
            typed = from_trailing(err.trailing_metadata())
            return typed if isinstance(typed, ChannelNotExist) else None
        for d in described.descriptions:
            if d.data_loss:
                why = d.data_loss.removeprefix(f"{pb.StreamingCode.Name(DataLoss.code)}: ")
                return DataLoss(f"{why} (coord {self.coord})")
        return None

    def report_error(self, route: Route, err: StreamingError) -> None:
        """Tell the coord this route failed (dropped when the stream is down: the coord's
        probes find dead nodes anyway, the report only makes it look sooner)."""
        if self._reports is None:
            return
        self._reports.put_nowait(
            pb.AssignmentDiscoverRequest(
                report_error=pb.ReportAssignmentErrorRequest(
                    pchannel=route.info(), err=err.to_proto()
                )
            )
        )

    def _apply(self, full: pb.FullStreamingNodeAssignmentWithVersion) -> bool:
        version = version_of(full)
        if version <= self.version:
            return False  # a replay after reconnecting, or older than what we hold
        self.version = version
        self.routes = routes_of(full)
        self._signal()
        return True

    def _apply_delta(self, delta: pb.AssignmentDelta) -> bool:
        base, version = version_of(delta), _pair(delta.version)
        if version <= self.version:
            return False  # a replay, or the empty delta of an up-to-date resume
        if _pair(delta.base) != self.version:
            raise Unavailable(f"coord {self.coord}: delta from {base}, we hold {self.version}")
        routes = dict(self.routes)
        for name in delta.unassigned:
            routes.pop(name, None)
        routes.update(routes_of(delta))
        self.version, self.routes = version, routes
        self._signal()
        return True

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._stream()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the stream broke: reconnect, bounded backoff
                log.info("assignment stream broke", extra={"coord": self.coord, "error": str(err)})
            self.connected.clear()
            self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(self._max_backoff, backoff * 2)

    async def _stream(self) -> None:
        assert self._channel is not None
        stub = pbg.StreamingCoordAssignmentServiceStub(self._channel)
        reports: asyncio.Queue[pb.AssignmentDiscoverRequest | None] = asyncio.Queue()

        async def requests():
            # Ends at the None put below when the call ends: gRPC's task draining this
            # iterator is not cancelled with a failed call, and a pending task dropped
            # with the call is "Task was destroyed but it is pending!" at exit.
            while (request := await reports.get()) is not None:
                yield request

        metadata = [(DELTAS, "deltas")]
        if self.version >= (0, 0):
            metadata.append((RESUME_FROM, "{}.{}".format(*self.version)))
        call = stub.AssignmentDiscover(requests(), metadata=metadata)
        try:
            async for response in call:
                kind = response.WhichOneof("response")
                if kind in ("full_assignment", "delta"):
                    self._reports = reports
                    self.connected.set()
                    if kind == "delta":
                        self._apply_delta(response.delta)
                    else:
                        self._apply(response.full_assignment)
                elif kind == "close":
                    return
        except grpc.RpcError as err:
            raise Unavailable(f"coord {self.coord}: {err.code().name}") from None
        finally:
            if self._reports is reports:
                self._reports = None
            reports.put_nowait(None)
            call.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
