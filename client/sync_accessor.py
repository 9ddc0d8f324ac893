"""Blocking twin of the WAL accessor: the asyncio one driven from a private loop thread.

Every call is forwarded to the loop that owns the gRPC channels (the portal of
`client/sync.py`), so routing, rerouting and resends behave exactly as in the asyncio
accessor. Handlers given to `read` run on that loop's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from streamwal.client.accessor import Broadcast, WALAccessor
from streamwal.client.aio import connect as connect_aio
from streamwal.client.append import AppendOption, AppendResponses, AppendResult, Message
from streamwal.client.broadcast import BroadcastAppendResult
from streamwal.client.consumed import ConsumedMessage
from streamwal.client.consumer_group import GroupConsumer, GroupDescription
from streamwal.client.msgstream import EARLIEST, MsgStream
from streamwal.client.msgstream_types import MsgPack, MsgPosition, RepackFunc
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.scanner import Handler, Scanner
from streamwal.client.sync import SyncConsumer, SyncProducer, _Portal
from streamwal.client.txn import TxnResult
from streamwal.client.wal_txn import WALTxn
from streamwal.message import ResourceKey


class SyncScanner:
    """`done()` is a threading.Event here."""

    def __init__(self, portal: _Portal, scanner: Scanner) -> None:
        self._portal = portal
        self._scanner = scanner
        self._done = threading.Event()
        scanner.add_done_callback(self._done.set)

    def done(self) -> threading.Event:
        return self._done

    def error(self) -> BaseException | None:
        return self._scanner.error()

    def close(self) -> None:
        self._portal.call(self._scanner.close())


class SyncTxn:
    """The accessor's transaction, blocking; `with wal.txn(v) as txn:` commits on a clean
    exit and rolls back on an exception."""

    def __init__(self, portal: _Portal, txn: WALTxn) -> None:
        self._portal = portal
        self.aio = txn

    @property
    def txn_id(self) -> int:
        return self.aio.txn_id

    @property
    def result(self) -> TxnResult | None:
        """What the commit appended (after a commit)."""
        return self.aio.result

    def append(self, msg: Message | bytes) -> None:
        self._portal.call(self.aio.append(msg))

    def commit(self, *, barrier_time_tick: int = 0) -> TxnResult:
        return self._portal.call(self.aio.commit(barrier_time_tick=barrier_time_tick))

    def rollback(self) -> None:
        self._portal.call(self.aio.rollback())

    def __enter__(self) -> SyncTxn:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._portal.call(self.aio.__aexit__(exc_type, exc, tb))


class SyncBroadcast:
    """The accessor's Broadcast, blocking."""

    def __init__(self, portal: _Portal, broadcast: Broadcast) -> None:
        self._portal = portal
        self._broadcast = broadcast

    def append(
        self, message, vchannels: Sequence[str], resource_keys: Sequence[ResourceKey] = (), **opts
    ) -> BroadcastAppendResult:
        return self._portal.call(self._broadcast.append(message, vchannels, resource_keys, **opts))

    def ack(self, broadcast_id: int, vchannel: str, **options) -> None:
        self._portal.call(self._broadcast.ack(broadcast_id, vchannel, **options))

    def block_until_resource_key_ack_once(self, key: ResourceKey, **options) -> None:
        self._portal.call(self._broadcast.block_until_resource_key_ack_once(key, **options))

    def block_until_resource_key_ack_all(self, key: ResourceKey, **options) -> None:
        self._portal.call(self._broadcast.block_until_resource_key_ack_all(key, **options))


class SyncMsgStream:
    """MsgStream's (and TtMsgStream's) methods, blocking."""

    def __init__(self, portal: _Portal, stream: MsgStream) -> None:
        self._portal = portal
        self._stream = stream

    def as_producer(self, channels: Sequence[str]) -> None:
        self._portal.call(self._stream.as_producer(channels))

    def as_consumer(self, channels: Sequence[str], sub_name: str, position: str = EARLIEST) -> None:
        self._portal.call(self._stream.as_consumer(channels, sub_name, position))

    def set_repack_func(self, repack: RepackFunc) -> None:
        self._stream.set_repack_func(repack)

    def produce(self, pack: MsgPack) -> dict[str, list[MsgPosition]]:
        return self._portal.call(self._stream.produce(pack))

    def broadcast(self, pack: MsgPack) -> dict[str, list[MsgPosition]]:
        return self._portal.call(self._stream.broadcast(pack))

    def consume(self, timeout: float | None = None) -> MsgPack:
        return self._portal.call(self._stream.consume(timeout))

    def seek(self, positions: Iterable[MsgPosition]) -> None:
        self._portal.call(self._stream.seek(list(positions)))

    def close(self) -> None:
        self._portal.call(self._stream.close())

    def __enter__(self) -> SyncMsgStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncGroupConsumer:
    """GroupConsumer's methods, blocking."""

    def __init__(self, portal: _Portal, consumer: GroupConsumer) -> None:
        self._portal = portal
        self._consumer = consumer

    @property
    def redelivered(self) -> int:
        """Messages this member got that a gone member had got before."""
        return self._consumer.group.redelivered

    def next_batch(self, limit: int | None = None) -> list[ConsumedMessage]:
        return self._portal.call(self._consumer.next_batch(limit))

    def commit(self) -> int | None:
        return self._portal.call(self._consumer.commit())

    def describe(self) -> GroupDescription:
        return self._portal.call(self._consumer.group.describe())

    def close(self) -> None:
        self._portal.call(self._consumer.close())

    def __enter__(self) -> SyncGroupConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncWALAccessor:
    """WALAccessor's methods, blocking."""

    def __init__(self, portal: _Portal, accessor: WALAccessor) -> None:
        self._portal = portal
        self.aio = accessor  # the asyncio accessor, for code running on the portal's loop

    def wal_name(self) -> str:
        return self.aio.wal_name()

    def latest_mvcc_timestamp_if_local(self, vchannel: str) -> int:
        return self.aio.latest_mvcc_timestamp_if_local(vchannel)

    def raw_append(self, msg: Message, *, barrier_time_tick: int = 0) -> AppendResult:
        return self._portal.call(self.aio.raw_append(msg, barrier_time_tick=barrier_time_tick))

    def txn(self, vchannel: str, keepalive: float | None = None) -> SyncTxn:
        return SyncTxn(self._portal, self._portal.call(self.aio.txn(vchannel, keepalive)))

    def append_messages(self, *msgs: Message) -> AppendResponses:
        return self._portal.call(self.aio.append_messages(*msgs))

    def append_messages_with_option(self, opts: AppendOption, *msgs: Message) -> AppendResponses:
        return self._portal.call(self.aio.append_messages_with_option(opts, *msgs))

    def read(
        self,
        vchannel: str,
        deliver_policy: DeliverPolicy | None = None,
        deliver_filters: Sequence[DeliverFilter] = (),
        handler: Handler | None = None,
        *,
        time_ticks: bool = False,
    ) -> SyncScanner:
        async def start() -> Scanner:
            return self.aio.read(
                vchannel, deliver_policy, deliver_filters, handler, time_ticks=time_ticks
            )

        return SyncScanner(self._portal, self._portal.call(start()))

    def broadcast(self) -> SyncBroadcast:
        async def make() -> Broadcast:  # its gRPC channel belongs to the portal's loop
            return self.aio.broadcast()

        return SyncBroadcast(self._portal, self._portal.call(make()))

    def msg_stream(self) -> SyncMsgStream:
        return SyncMsgStream(self._portal, self.aio.msg_stream())

    def tt_msg_stream(self) -> SyncMsgStream:
        return SyncMsgStream(self._portal, self.aio.tt_msg_stream())

    def new_producer(
        self, channel: str, *, producer_id: str | None = None, **options
    ) -> SyncProducer:
        """See WALAccessor.new_producer (close it)."""
        opened = self.aio.new_producer(channel, producer_id=producer_id, **options)
        return SyncProducer(self._portal, self._portal.call(opened))

    def consumer(
        self,
        channel: str,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
        timeout: float | None = None,
    ) -> SyncConsumer:
        """See WALAccessor.consumer; `timeout` bounds each wait for the next batch (None:
        wait forever). Iterate it, or call `next_batch()`."""
        opened = self.aio.consumer(
            channel, policy, filters, time_ticks=time_ticks, end_offset=end_offset
        )
        return SyncConsumer(self._portal, self._portal.call(opened), timeout)

    def end_offset(self, channel: str) -> int:
        return self._portal.call(self.aio.end_offset(channel))

    def consumer_group(self, channel: str, group: str, **options) -> SyncGroupConsumer:
        """See WALAccessor.consumer_group."""
        consumer = self._portal.call(self.aio.consumer_group(channel, group, **options))
        return SyncGroupConsumer(self._portal, consumer)

    def describe_groups(self, channel: str, groups: Sequence[str] = ()) -> list[GroupDescription]:
        return self._portal.call(self.aio.describe_groups(channel, groups))

    def close(self) -> None:
        try:
            self._portal.call(self.aio.close())
        finally:
            self._portal.stop()

    def __enter__(self) -> SyncWALAccessor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_blocking(coord: str | None = None, **options) -> SyncWALAccessor:
    """Blocking `streamwal.client.aio.connect`."""
    portal = _Portal()
    try:
        accessor = portal.call(connect_aio(coord, **options))
    except BaseException:
        portal.stop()
        raise
    return SyncWALAccessor(portal, accessor)
