"""The WAL accessor (seed 002's WALAccesser), asyncio form: what applications program against.

It sits on the routed client (`client/wal.py`): one AssignmentDiscover stream to the
coord, producers and consumers that follow each pchannel to its current owner. Appends go
through one idempotent, rerouting producer per pchannel, each message naming its vchannel.

    wal = await streamwal.client.aio.connect(coord="127.0.0.1:19500")
    r = await wal.raw_append(Message("pchannel_0_v1", b"hello"))
    scanner = wal.read("pchannel_0_v1", handler=print)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from streamwal.client.append import (
    AppendOption,
    AppendResponses,
    AppendResult,
    Message,
    gather_responses,
    group_by_vchannel,
)
from streamwal.client.broadcast import BroadcastAppendResult, BroadcastClient
from streamwal.client.consumer_group import (
    AUTO_COMMIT_INTERVAL_S,
    SESSION_TIMEOUT_S,
    GroupConsumer,
    GroupDescription,
    RoutedGroup,
    describe_groups,
)
from streamwal.client.msgstream import MsgStream, TtMsgStream
from streamwal.client.node_client import ConsumedMessage
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.routing import RoutedConsumer, RoutedProducer
from streamwal.client.scanner import Handler, Scanner
from streamwal.client.wal import WAL
from streamwal.client.wal_txn import WALTxn
from streamwal.errors import InvalidArgument, StreamingError
from streamwal.message import ResourceKey, pchannel_of
from streamwal.transport import TransportConfig

WAL_NAME = "streamwal"


class WALLocatedRemote(StreamingError):
    """The accessor has no local view of the vchannel's time (Milvus's "wal located remote")."""


class Broadcast:
    """The accessor's broadcast service (seed 002's Broadcast): the coord's BroadcastClient,
    whose acknowledged ticks also feed the accessor's MVCC view."""

    def __init__(self, client: BroadcastClient, observe: Callable[[str, int], None]) -> None:
        self.client = client
        self._observe = observe

    async def append(
        self,
        message: Any,
        vchannels: Sequence[str],
        resource_keys: Sequence[ResourceKey] = (),
        **options,
    ) -> BroadcastAppendResult:
        """`message` (bytes, a Message, a TsMsg) to every vchannel, atomically and exactly
        once each; the resource keys are held until the broadcast is acked everywhere."""
        result = await self.client.append(message, vchannels, resource_keys, **options)
        for vchannel, r in result.results.items():
            self._observe(vchannel, r.time_tick)
        return result

    async def ack(self, broadcast_id: int, vchannel: str, **options) -> None:
        await self.client.ack(broadcast_id, vchannel, **options)

    async def block_until_resource_key_ack_once(self, key: ResourceKey, **options) -> None:
        await self.client.block_until_resource_key_ack_once(key, **options)

    async def block_until_resource_key_ack_all(self, key: ResourceKey, **options) -> None:
        await self.client.block_until_resource_key_ack_all(key, **options)


class WALAccessor:
    """Appends, transactions, broadcasts and reads by vchannel; see the module docstring."""

    def __init__(self, wal: WAL, transport: TransportConfig | None = None) -> None:
        self.wal = wal
        self._transport = transport
        self._broadcast: Broadcast | None = None
        self._producers: dict[str, RoutedProducer] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._mvcc: dict[str, int] = {}  # pchannel -> highest tick acknowledged or delivered
        self._scanners: set[Scanner] = set()

    @property
    def coord(self) -> str:
        return self.wal.watcher.coord

    def wal_name(self) -> str:
        return WAL_NAME

    # -- time --------------------------------------------------------------------------

    def _pchannel(self, channel: str) -> str:
        return channel if channel in self.wal.watcher.routes else pchannel_of(channel)

    def observe(self, channel: str, tick: int) -> None:
        """Record a tick acknowledged or delivered on `channel` (pchannel or vchannel)."""
        pchannel = self._pchannel(channel)
        if tick > self._mvcc.get(pchannel, 0):
            self._mvcc[pchannel] = tick

    def latest_mvcc_timestamp_if_local(self, vchannel: str) -> int:
        """The highest time tick this accessor saw acknowledged (its own appends) or
        delivered (its scanners, idle TimeTicks included) on the vchannel's pchannel.

        Ticks are allocated in append order and a pchannel commits in that order, so
        everything at or below this tick on the vchannel is settled: a read filtered with
        `time_tick_lte`-style logic at it sees a fixed snapshot. With nothing seen the
        accessor has no local view and raises WALLocatedRemote (as Milvus does when the
        WAL is not in-process)."""
        tick = self._mvcc.get(self._pchannel(vchannel))
        if tick is None:
            raise WALLocatedRemote(
                f"vchannel {vchannel!r}: this accessor has neither appended to nor read its "
                "pchannel, so it knows no local MVCC timestamp"
            )
        return tick

    # -- appends -----------------------------------------------------------------------

    async def producer(self, pchannel: str) -> RoutedProducer:
        """The accessor's one rerouting, idempotent producer for `pchannel`."""
        producer = self._producers.get(pchannel)
        if producer is not None:
            return producer
        lock = self._opening.setdefault(pchannel, asyncio.Lock())
        async with lock:
            producer = self._producers.get(pchannel)
            if producer is None:
                producer = await self.wal.producer(pchannel)
                self._producers[pchannel] = producer
        return producer

    async def new_producer(
        self, channel: str, *, producer_id: str | None = None, **options
    ) -> RoutedProducer:
        """A producer of its own (close it) for a pchannel or a vchannel, with the node
        producer's options (`ack_level`, batching, liveness bounds); it follows the
        pchannel across failovers and resends, idempotently, what was not acknowledged.
        A stable `producer_id` lets a restarted application's resends be answered
        instead of appended again."""
        return await self.wal.producer(channel, producer_id=producer_id, **options)

    async def consumer(
        self,
        channel: str,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
    ) -> RoutedConsumer:
        """Read a pchannel (everything) or a vchannel (its messages) wherever it is served,
        across failovers, never repeating an offset; `end_offset` bounds the read."""
        return await self.wal.consumer(
            channel, policy, filters, time_ticks=time_ticks, end_offset=end_offset
        )

    async def end_offset(self, channel: str) -> int:
        """The offset the channel's pchannel gives its next message."""
        pchannel, _ = await self.wal.resolve(channel)
        return await self.wal.end_offset(pchannel)

    async def append_batch(
        self, vchannel: str, msgs: Sequence[Message], barrier_time_tick: int
    ) -> list[AppendResult]:
        """Append messages of one vchannel as one atomic batch (all or none)."""
        try:
            entries = [m.entry() for m in msgs]
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        pchannel, _ = await self.wal.resolve(vchannel)
        producer = await self.producer(pchannel)
        base, tick = await producer.send_batch(entries, barrier_time_tick)
        self.observe(pchannel, tick + len(entries) - 1)
        return [AppendResult(vchannel, base + i, tick + i) for i in range(len(entries))]

    async def raw_append(self, msg: Message, *, barrier_time_tick: int = 0) -> AppendResult:
        """Append one message; once it returns the message is durable. Its time tick is
        above `barrier_time_tick` (the owner's clock is pushed past it first)."""
        (result,) = await self.append_batch(msg.vchannel, [msg], barrier_time_tick)
        return result

    async def append_messages(self, *msgs: Message) -> AppendResponses:
        return await self.append_messages_with_option(AppendOption(), *msgs)

    async def append_messages_with_option(
        self, opts: AppendOption, *msgs: Message
    ) -> AppendResponses:
        """Append messages grouped by vchannel, the groups concurrently; each group is
        atomic (all its messages or none). Responses are per message, in input order;
        nothing is promised across vchannels."""
        groups = group_by_vchannel(msgs)

        async def one(vchannel: str, indexes: list[int]):
            try:
                group = [msgs[i] for i in indexes]
                return indexes, await self._append_group(vchannel, group, opts)
            except StreamingError as err:
                return indexes, err

        outcomes = await asyncio.gather(*(one(v, ix) for v, ix in groups.items()))
        return gather_responses(len(msgs), outcomes)

    async def _append_group(
        self, vchannel: str, msgs: list[Message], opts: AppendOption
    ) -> list[AppendResult]:
        """One message alone, several as one transaction (Milvus's appendToVChannel)."""
        if len(msgs) == 1:
            return await self.append_batch(vchannel, msgs, opts.barrier_time_tick)
        txn = await self.txn(vchannel)
        try:
            for msg in msgs:
                await txn.append(msg)
        except BaseException:
            with suppress(StreamingError):
                await txn.rollback()
            raise
        result = await txn.commit(barrier_time_tick=opts.barrier_time_tick)
        return [
            AppendResult(vchannel, mid, result.time_tick, txn.txn_id) for mid in result.message_ids
        ]

    # -- transactions ------------------------------------------------------------------

    async def txn(self, vchannel: str, keepalive: float | None = None) -> WALTxn:
        """Begin a transaction on `vchannel`: its messages appear together, contiguous,
        with the commit's time tick, or never. `keepalive` (seconds) is how long it may
        go without an append before the node expires it (None: the node's default)."""
        pchannel, _ = await self.wal.resolve(vchannel)
        producer = await self.producer(pchannel)
        return WALTxn(await producer.begin_txn(vchannel, keepalive), self.observe)

    # -- broadcast ---------------------------------------------------------------------

    def broadcast(self) -> Broadcast:
        """Atomic appends to many vchannels through the coord, with resource keys."""
        if self._broadcast is None:
            client = BroadcastClient(self.coord, transport=self._transport)
            self._broadcast = Broadcast(client, self.observe)
        return self._broadcast

    # -- reads -------------------------------------------------------------------------

    def read(
        self,
        vchannel: str,
        deliver_policy: DeliverPolicy | None = None,
        deliver_filters: Sequence[DeliverFilter] = (),
        handler: Handler | None = None,
        *,
        time_ticks: bool = False,
    ) -> Scanner:
        """Deliver the vchannel's messages to `handler` in a background task, following
        the pchannel across moves and failovers without gaps or repeats. With
        `time_ticks` the handler also gets the node's TimeTick messages."""
        if handler is None:
            raise InvalidArgument("read needs a handler")

        async def open_consumer():
            return await self.wal.consumer(
                vchannel, deliver_policy, deliver_filters, time_ticks=time_ticks
            )

        def observe(msg: ConsumedMessage) -> None:
            self.observe(vchannel, msg.time_tick)

        scanner = Scanner(open_consumer, handler, observe)
        self._scanners.add(scanner)
        scanner.add_done_callback(lambda: self._scanners.discard(scanner))
        return scanner

    # -- message streams ---------------------------------------------------------------

    def msg_stream(self) -> MsgStream:
        """A MsgStream on this accessor (seed 001's MsgStreamFactory.NewMsgStream)."""
        return MsgStream(self)

    def tt_msg_stream(self) -> TtMsgStream:
        """A TtMsgStream on this accessor: one pack per time tick across its channels."""
        return TtMsgStream(self)

    # -- consumer groups ---------------------------------------------------------------

    async def consumer_group(
        self,
        channel: str,
        group: str,
        *,
        at_least_once: bool = True,
        auto_commit_interval: float | None = AUTO_COMMIT_INTERVAL_S,
        session_timeout: float = SESSION_TIMEOUT_S,
        batch: int = 256,
    ) -> GroupConsumer:
        """Join consumer group `group` of a channel (created on first use): its members
        share the messages. At-least-once by default: `next_batch()` commits what it
        returned before once `auto_commit_interval` has passed (None: call `commit()`);
        a member gone for `session_timeout` has its uncommitted messages redelivered to
        the others. `at_least_once=False`: each message once at most."""
        pchannel, vchannel = await self.wal.resolve(channel)
        routed = RoutedGroup(
            self.wal,
            pchannel,
            group,
            vchannel,
            at_least_once=at_least_once,
            session_timeout=session_timeout,
        )
        await routed.create()
        return GroupConsumer(routed, batch=batch, auto_commit_interval=auto_commit_interval)

    async def describe_groups(
        self, channel: str, groups: Sequence[str] = ()
    ) -> list[GroupDescription]:
        """The consumer groups of a channel's pchannel (all when none is named): committed
        offset, end offset, lag and members."""
        return await describe_groups(self.wal, channel, groups)

    # -- lifetime ----------------------------------------------------------------------

    async def close(self) -> None:
        for scanner in list(self._scanners):
            await scanner.close()
        for producer in self._producers.values():
            await producer.close()
        self._producers.clear()
        if self._broadcast is not None:
            await self._broadcast.client.close()
        await self.wal.close()

    async def __aenter__(self) -> WALAccessor:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
