"""The routing tier: `open_wal(coord=...)` and a small WALAccesser-like object, under the
public accessor (`streamwal.client.connect` / `streamwal.client.aio.connect`, which is
what applications use; this tier serves the accessor, the CLI, the demo and tests).

Applications name channels, not nodes: a pchannel (`pchannel_3`) or a vchannel on it
(`pchannel_3_v7`, Milvus's `<pchannel>_<suffix>`). The WAL object keeps one
AssignmentDiscover stream to the coord and routes every producer and consumer to the
current owner, following moves and failovers (see `routing`).

    wal = await open_wal(coord="127.0.0.1:19500")
    producer = await wal.producer("pchannel_0_v1")     # vchannel: messages carry it
    await producer.send(b"hello")
    consumer = await wal.consumer("pchannel_0_v1")     # only that vchannel's messages
    async for message in consumer: ...
    await wal.close()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress

from streamwal.client.discovery import AssignmentWatcher, NoRoute, Route
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.routing import (
    ASK_COORD_AFTER,
    ASK_COORD_MAX,
    RoutedConsumer,
    RoutedProducer,
    Router,
)
from streamwal.errors import ChannelNotExist
from streamwal.message import pchannel_of
from streamwal.transport import TransportConfig


class WAL:
    """Producers and consumers by channel name, routed through the coord's assignment."""

    def __init__(self, watcher: AssignmentWatcher, router: Router) -> None:
        self.watcher = watcher
        self.router = router

    def assignments(self) -> dict[str, Route]:
        """The newest assignment the coord pushed: {pchannel: Route}."""
        return dict(self.watcher.routes)

    async def resolve(self, channel: str, timeout: float | None = None) -> tuple[str, str | None]:
        """(pchannel, vchannel or None) for a channel name, waiting (bounded) until known.

        A name the assignment lists is a pchannel; otherwise it is a vchannel whose
        pchannel is `pchannel_of(name)`. (Pchannel names also end in `_<n>`, so the
        assignment, not the shape of the name, decides.)
        """
        deadline = time.monotonic() + (timeout or self.router.failover_timeout)
        ask_coord_at, ask_every = time.monotonic(), ASK_COORD_AFTER
        while True:
            routes = self.watcher.routes
            if channel in routes:
                return channel, None
            parent = pchannel_of(channel)
            if parent != channel and parent in routes:
                return parent, channel
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoRoute(
                    f"channel {channel!r}: neither it nor {parent!r} is assigned "
                    f"(coord {self.watcher.coord}, version {self.watcher.version})"
                )
            if time.monotonic() >= ask_coord_at:
                await self._refuse_unservable(channel, parent, min(2.0, remaining))
                ask_coord_at = time.monotonic() + ask_every
                ask_every = min(2 * ask_every, ASK_COORD_MAX)
            with suppress(NoRoute):
                await self.watcher.wait_route(channel, None, min(remaining, 0.2))

    async def _refuse_unservable(self, channel: str, parent: str, timeout: float) -> None:
        """Raise what the coord says of an unassigned name: DataLoss, or ChannelNotExist
        when neither it nor (for a vchannel's name) its pchannel exists; a typo fails at
        once, not after the failover wait."""
        refusal = await self.watcher.refusal(channel, timeout)
        if isinstance(refusal, ChannelNotExist) and parent != channel:
            refusal = await self.watcher.refusal(parent, timeout)
        if isinstance(refusal, ChannelNotExist):
            raise ChannelNotExist(
                f"no such channel: {channel!r} (coord {self.watcher.coord}; "
                "streamwal channel list, streamwal channel create)"
            )
        if refusal is not None:
            raise refusal

    async def producer(
        self, channel: str, *, producer_id: str | None = None, **options
    ) -> RoutedProducer:
        """A producer for a pchannel, or for a vchannel (its messages are tagged with it).

        Give a stable `producer_id` to let a restarted application's resends be answered
        instead of appended again; the default is random (idempotent within this object).
        """
        pchannel, vchannel = await self.resolve(channel)
        producer = RoutedProducer(
            self.router, pchannel, producer_id=producer_id, vchannel=vchannel, **options
        )
        return await producer.open()

    async def consumer(
        self,
        channel: str,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
    ) -> RoutedConsumer:
        """A consumer of a pchannel (everything) or of a vchannel (only its messages)."""
        pchannel, vchannel = await self.resolve(channel)
        if vchannel is not None:
            filters = [*filters, DeliverFilter.vchannel(vchannel)]
        consumer = RoutedConsumer(
            self.router,
            pchannel,
            policy,
            filters,
            time_ticks=time_ticks,
            end_offset=end_offset,
        )
        return await consumer.open()

    async def end_offset(self, pchannel: str) -> int:
        """The offset the pchannel's next message will get, asked of its current owner."""
        _, offset = await self.router.reopen(pchannel, None, None, self._next_offset)
        return offset

    async def _next_offset(self, route: Route) -> int:
        status = await self.router.client(route.address).collect_status()
        for channel in status.channels:
            if channel.pchannel.name == route.pchannel and channel.pchannel.term == route.term:
                return channel.next_offset
        raise ChannelNotExist(f"node {route.address} does not serve {route.pchannel!r} now")

    async def close(self) -> None:
        await self.router.close()
        await self.watcher.close()

    async def __aenter__(self) -> WAL:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def open_wal(
    coord: str,
    *,
    timeout: float = 10.0,
    failover_timeout: float = 30.0,
    transport: TransportConfig | None = None,
) -> WAL:
    """Connect to a streamwal cluster through its coord (HOST:PORT).

    `timeout` bounds the wait for the first assignment; `failover_timeout` bounds how long
    a send or read waits for a pchannel's next owner before failing with `NoRoute`.
    """
    watcher = await AssignmentWatcher(coord, transport).start(timeout)
    return WAL(watcher, Router(watcher, transport, failover_timeout))
