"""A RocksMQ-style consumer group (seed 001) on a pchannel, wherever the pchannel is served.

The node keeps the group's cursor in the pchannel's log (node/groups.py), so it survives
restarts and moves with the pchannel; this wrapper only finds the current owner for each
call through the router (reporting and waiting out a failover like every routed call).
Each consume carries this wrapper's consumer id and a new claim number, repeated by the
router's retries: a consume whose answer was lost to a failover is answered again with
the same messages, so none is lost between the node and the consumer.
Consumers that share a group share its messages: each message goes to one of them.

Delivery is at-least-once by default (issue 18): what a member gets stays pending on it
until it commits (`commit()`, or the GroupConsumer's auto-commit, as Kafka clients'
enable.auto.commit); a member that leaves or is not heard from for `session_timeout`
has its uncommitted messages handed to the others. `at_least_once=False` is the older
at-most-once group (the node moves the cursor when it answers; MsgStream's shared
subscriptions keep it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from streamwal.client.discovery import Route
from streamwal.client.node_client import ConsumedMessage, NodeClient
from streamwal.client.wal import WAL
from streamwal.errors import ConsumerGroupExist
from streamwal.proto import groups_pb2 as gpb

T = TypeVar("T")


SESSION_TIMEOUT_S = 10.0
AUTO_COMMIT_INTERVAL_S = 5.0
# Auto-commit also once this many batches are uncommitted: the node holds at most 256
# uncommitted ranges per member (node/cursors.py MAX_PENDING) and refuses more.
AUTO_COMMIT_BATCHES = 128


@dataclass(frozen=True)
class GroupMember:
    consumer_id: str
    pending_ranges: int  # uncommitted ranges it holds
    pending_offsets: int  # offsets they span
    idle_seconds: float  # since the node last heard from it


@dataclass(frozen=True)
class GroupDescription:
    """A group on one pchannel: `lag` counts deliverable messages (no time ticks) from
    `committed` (every message below it was processed) to `end_offset`."""

    group: str
    pchannel: str
    cursor: int
    committed: int
    end_offset: int
    lag: int
    members: tuple[GroupMember, ...]
    orphaned_ranges: int  # a gone member's, waiting to be redelivered

    @staticmethod
    def of(pchannel: str, d: gpb.ConsumerGroupDescription) -> GroupDescription:
        return GroupDescription(
            d.group,
            pchannel,
            d.cursor,
            d.committed,
            d.end_offset,
            d.lag,
            tuple(
                GroupMember(m.consumer_id, m.pending_ranges, m.pending_offsets, m.idle_seconds)
                for m in d.members
            ),
            d.orphaned_ranges,
        )


async def describe_groups(
    wal: WAL, channel: str, groups: Sequence[str] = ()
) -> list[GroupDescription]:
    """The groups of a pchannel (all of them when none is named), from its owner."""
    pchannel, _ = await wal.resolve(channel)
    router = wal.router
    _, found = await router.reopen(
        pchannel,
        None,
        None,
        lambda r: router.client(r.address).describe_consumer_groups(pchannel, r.term, groups),
    )
    return [GroupDescription.of(pchannel, d) for d in found]


class RoutedGroup:
    """Group `group` on `pchannel`; with `vchannel`, consume keeps only its messages.

    At-least-once by default: call `commit()` once what `consume` returned is processed
    (or use GroupConsumer's auto-commit); `leave()` hands what is uncommitted to the
    others at once instead of after `session_timeout` seconds of silence."""

    def __init__(
        self,
        wal: WAL,
        pchannel: str,
        group: str,
        vchannel: str | None = None,
        *,
        at_least_once: bool = True,
        session_timeout: float = SESSION_TIMEOUT_S,
    ) -> None:
        self._wal = wal
        self.pchannel = pchannel
        self.group = group
        self.vchannel = vchannel
        self.at_least_once = at_least_once
        self.session_timeout = session_timeout
        self.consumer_id = uuid.uuid4().hex
        self._claims = itertools.count(1)
        self.delivered: int | None = None  # the highest offset consume returned
        self.committed_to: int | None = None  # the highest offset this member committed
        self.redelivered = 0  # messages this member got that another one had before
        self.uncommitted_batches = 0  # the node holds at most 256 per member

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
        got = await self._call(
            lambda nc, r: nc.group_consume(
                self.pchannel,
                r.term,
                self.group,
                n,
                consumer_id=self.consumer_id,
                claim=claim,
                at_least_once=self.at_least_once,
                session_timeout=self.session_timeout,
            )
        )
        if got:
            self.uncommitted_batches += 1
            top = max(m.offset for m in got)
            self.delivered = top if self.delivered is None else max(self.delivered, top)
            if got.redelivered:
                self.redelivered += len(got)
        return list(got)

    def uncommitted(self) -> bool:
        return self.delivered is not None and self.delivered != self.committed_to

    async def commit(self, offset: int | None = None) -> int | None:
        """Every message `consume` returned up to `offset` (default: all of them) is
        processed; returns the group's committed offset (None: nothing to commit)."""
        if not self.at_least_once:
            return None
        upto = self.delivered if offset is None else offset
        if upto is None:
            return None
        committed = await self._commit(upto, leave=False)
        self.committed_to = upto
        self.uncommitted_batches = 0
        return committed

    async def _commit(self, upto: int | None, leave: bool) -> int:
        return await self._call(
            lambda nc, r: nc.group_commit(
                self.pchannel,
                r.term,
                self.group,
                self.consumer_id,
                upto,
                leave=leave,
                session_timeout=self.session_timeout,
            )
        )

    async def leave(self) -> None:
        """Leave the group: what this member got and did not commit goes to the others."""
        if self.at_least_once:
            await self._commit(None, leave=True)

    async def describe(self) -> GroupDescription:
        found = await describe_groups(self._wal, self.pchannel, [self.group])
        return found[0]

    async def seek(self, offset: int) -> None:
        """The next consume starts at `offset`."""
        await self._call(lambda nc, r: nc.group_seek(self.pchannel, r.term, self.group, offset))


class GroupConsumer:
    """Polls a group: an endless `next_batch()` like RoutedConsumer's, of the group's
    vchannel only (the others' messages are taken and dropped: the group is this
    vchannel's own).

    Auto-commit (at-least-once groups; `auto_commit_interval` seconds, None: off, then
    call `commit()`): a call of `next_batch` treats every message returned before as
    processed and commits them once the interval has passed since the last commit, as
    Kafka's consumer does in poll() (or once AUTO_COMMIT_BATCHES batches are
    uncommitted). `close()` commits them too, then leaves the group."""

    def __init__(
        self,
        group: RoutedGroup,
        batch: int = 256,
        idle_s: float = 0.05,
        auto_commit_interval: float | None = AUTO_COMMIT_INTERVAL_S,
    ) -> None:
        self.group = group
        self._batch = batch
        self._idle_s = idle_s
        self.auto_commit_interval = auto_commit_interval
        self._committed_at = time.monotonic()

    async def next_batch(self, limit: int | None = None) -> list[ConsumedMessage]:
        """The next messages (at most `limit`, default the consumer's batch size)."""
        vchannel = self.group.vchannel
        while True:
            await self._auto_commit()
            msgs = await self.group.consume(limit or self._batch)
            mine = [m for m in msgs if vchannel is None or m.vchannel == vchannel]
            if mine:
                return mine
            if not msgs:
                await asyncio.sleep(self._idle_s)  # read everything: poll again shortly

    async def _auto_commit(self) -> None:
        interval = self.auto_commit_interval
        if interval is None or not self.group.uncommitted():
            return
        due = time.monotonic() - self._committed_at >= interval
        if due or self.group.uncommitted_batches >= AUTO_COMMIT_BATCHES:
            await self.commit()

    async def commit(self) -> int | None:
        """Commit every message returned so far; the group's committed offset."""
        self._committed_at = time.monotonic()
        return await self.group.commit()

    async def close(self) -> None:
        """Auto-commit on: commit what was returned. Then leave the group (what is still
        uncommitted goes to the other members at once)."""
        if not self.group.at_least_once:
            return
        if self.auto_commit_interval is not None and self.group.uncommitted():
            await self.group.commit()
        await self.group.leave()

    async def __aenter__(self) -> GroupConsumer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
