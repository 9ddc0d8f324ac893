"""A RocksMQ-style consumer group (seed 001) on a pchannel, wherever the pchannel is served.

The node keeps the group's cursor in the pchannel's log (node/groups.py), so it survives
restarts and moves with the pchannel; this wrapper only finds the current owner for each
call through the router (reporting and waiting out a failover like every routed call).
Each consume carries this wrapper's consumer id and a new claim number, repeated by the
router's retries: a consume whose answer was lost to a failover is answered again with
the same messages, so none is lost between the node and the consumer.
Consumers that share a group share its messages: each message goes to one of them.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from streamwal.client.discovery import Route
from streamwal.client.node_client import ConsumedMessage, NodeClient
from streamwal.client.wal import WAL
from streamwal.errors import ConsumerGroupExist

T = TypeVar("T")


class RoutedGroup:
    """Group `group` on `pchannel`; with `vchannel`, consume keeps only its messages."""

    def __init__(self, wal: WAL, pchannel: str, group: str, vchannel: str | None = None) -> None:
        self._wal = wal
        self.pchannel = pchannel
        self.group = group
        self.vchannel = vchannel
        self.consumer_id = uuid.uuid4().hex
        self._claims = itertools.count(1)

    async def _call(self, fn: Callable[[NodeClient, Route], Awaitable[T]]) -> T:
        router = self._wal.router
        _, result = await router.reopen(
            self.pchannel, None, None, lambda route: fn(router.client(route.address), route)
        )
        return result

    async def create(self) -> bool:
        """Create the group (cursor at the oldest retained message); False if it existed,
        so a second consumer of a subscription simply joins it."""
        try:
            await self._call(
                lambda nc, r: nc.create_consumer_group(self.pchannel, r.term, self.group)
            )
        except ConsumerGroupExist:
            return False
        return True

    async def consume(self, n: int) -> list[ConsumedMessage]:
        """Up to `n` messages after the cursor (all vchannels), which moves past them
        atomically; retried across failovers without losing them."""
        claim = next(self._claims)
        return await self._call(
            lambda nc, r: nc.group_consume(
                self.pchannel, r.term, self.group, n, consumer_id=self.consumer_id, claim=claim
            )
        )

    async def seek(self, offset: int) -> None:
        """The next consume starts at `offset`."""
        await self._call(lambda nc, r: nc.group_seek(self.pchannel, r.term, self.group, offset))


class GroupConsumer:
    """Polls a group: an endless `next_batch()` like RoutedConsumer's, of the group's
    vchannel only (the others' messages are taken and dropped: the group is this
    vchannel's own)."""

    def __init__(self, group: RoutedGroup, batch: int = 256, idle_s: float = 0.05) -> None:
        self.group = group
        self._batch = batch
        self._idle_s = idle_s

    async def next_batch(self) -> list[ConsumedMessage]:
        vchannel = self.group.vchannel
        while True:
            msgs = await self.group.consume(self._batch)
            mine = [m for m in msgs if vchannel is None or m.vchannel == vchannel]
            if mine:
                return mine
            if not msgs:
                await asyncio.sleep(self._idle_s)  # read everything: poll again shortly

    async def close(self) -> None:
        """Nothing to release: the cursor lives on the node."""

    async def __aenter__(self) -> GroupConsumer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
