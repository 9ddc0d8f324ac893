"""The synchronous client: the asyncio client driven from a private event-loop thread.

Scripts and notebooks call `SyncNodeClient(...).producer(...).send(...)` without asyncio;
every call is forwarded to the one loop that owns the gRPC channel, so there is a single
implementation of batching, pipelining and error mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from streamwal.client.node_client import Appended, AppendedBatch, ConsumedMessage, NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.txn import Txn, TxnResult
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig

T = TypeVar("T")


class _Portal:
    """An event loop in a daemon thread, and a way to run coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="streamwal")
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel every task still on the loop and wait for them (bounded), then stop the
        loop and close it: on any path, an error in `connect` included, nothing is left
        for the garbage collector to report as "Task was destroyed but it is pending!"."""

        async def cancel_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            if rest:
                await asyncio.wait(rest, timeout=timeout)
            await self.loop.shutdown_asyncgens()

        if self.loop.is_running():
            done = asyncio.run_coroutine_threadsafe(cancel_rest(), self.loop)
            with contextlib.suppress(Exception):
                done.result(timeout + 1)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class SyncNodeTxn:
    """Blocking twin of client/txn.py's Txn, the node tier's (same methods, same errors);
    the accessor's is `streamwal.client.sync_accessor.SyncTxn`."""

    def __init__(self, portal: _Portal, txn: Txn) -> None:
        self._portal = portal
        self._txn = txn
        self.vchannel = txn.vchannel
        self.txn_id = txn.txn_id
        self.keepalive = txn.keepalive

    def append(
        self,
        payload: bytes,
        *,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self._portal.call(self._txn.append(payload, msg_type=msg_type, properties=properties))

    def commit(self) -> TxnResult:
        return self._portal.call(self._txn.commit())

    def rollback(self) -> None:
        self._portal.call(self._txn.rollback())


class SyncProducer:
    def __init__(self, portal: _Portal, producer) -> None:
        self._portal = portal
        self._producer = producer

    def begin_txn(self, vchannel: str, keepalive: float | None = None) -> SyncNodeTxn:
        """See Producer.begin_txn: a txn on `vchannel`, None keepalive = the node's default."""
        return SyncNodeTxn(
            self._portal, self._portal.call(self._producer.begin_txn(vchannel, keepalive))
        )

    def send(
        self,
        payload: bytes,
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> Appended:
        return self._portal.call(
            self._producer.send(
                payload, vchannel=vchannel, msg_type=msg_type, properties=properties
            )
        )

    def send_many(self, payloads: Iterable[bytes], **kwargs) -> AppendedBatch:
        return self._portal.call(self._producer.send_many(list(payloads), **kwargs))

    def close(self) -> None:
        self._portal.call(self._producer.close())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncConsumer:
    """Iterates messages; `timeout` bounds each wait for the next batch (None: forever)."""

    def __init__(self, portal: _Portal, consumer, timeout: float | None) -> None:
        self._portal = portal
        self._consumer = consumer
        self._timeout = timeout
        self._buffer: list[ConsumedMessage] = []
        self._pos = 0

    def __iter__(self) -> Iterator[ConsumedMessage]:
        return self

    def __next__(self) -> ConsumedMessage:
        if self._pos >= len(self._buffer):
            batch = self.next_batch()
            if batch is None:
                raise StopIteration
            self._buffer, self._pos = batch, 0
        msg = self._buffer[self._pos]
        self._pos += 1
        return msg

    def next_batch(self) -> list[ConsumedMessage] | None:
        """The next frame's messages; raises TimeoutError after `timeout` without one."""
        return self._portal.call(self._consumer.next_batch(), self._timeout)

    @property
    def first_offset(self) -> int:
        return self._consumer.first_offset

    @property
    def next_offset(self) -> int:
        return self._consumer.next_offset

    def close(self) -> None:
        self._portal.call(self._consumer.close())

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncNodeClient:
    """Blocking twin of NodeClient, with the same methods."""

    def __init__(self, address: str, transport: TransportConfig | None = None) -> None:
        self._portal = _Portal()

        async def make() -> NodeClient:
            return NodeClient(address, transport)

        self._client = self._portal.call(make())

    def assign(self, pchannel: str, term: int, **options) -> None:
        self._portal.call(self._client.assign(pchannel, term, **options))

    def remove(self, pchannel: str, term: int) -> None:
        self._portal.call(self._client.remove(pchannel, term))

    def fence(self, pchannel: str, term: int) -> pb.FenceResponse:
        return self._portal.call(self._client.fence(pchannel, term))

    def collect_status(self) -> pb.StreamingNodeManagerCollectStatusResponse:
        return self._portal.call(self._client.collect_status())

    def create_consumer_group(self, pchannel: str, term: int, group: str) -> int:
        """See NodeClient.create_consumer_group (cursor at the oldest offset, returned)."""
        return self._portal.call(self._client.create_consumer_group(pchannel, term, group))

    def destroy_consumer_group(self, pchannel: str, term: int, group: str) -> None:
        self._portal.call(self._client.destroy_consumer_group(pchannel, term, group))

    def group_consume(
        self, pchannel: str, term: int, group: str, n: int, *, consumer_id: str = "", claim: int = 0
    ) -> list[ConsumedMessage]:
        """See NodeClient.group_consume: up to n messages, the group's cursor moved past them
        (a repeated claim of `consumer_id` gets the same ones again)."""
        return self._portal.call(
            self._client.group_consume(
                pchannel, term, group, n, consumer_id=consumer_id, claim=claim
            )
        )

    def group_seek(
        self, pchannel: str, term: int, group: str, message_id: int | pb.MessageID
    ) -> None:
        self._portal.call(self._client.group_seek(pchannel, term, group, message_id))

    def producer(self, pchannel: str, term: int, **options) -> SyncProducer:
        return SyncProducer(
            self._portal, self._portal.call(self._client.producer(pchannel, term, **options))
        )

    def consumer(
        self,
        pchannel: str,
        term: int,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
        timeout: float | None = None,
    ) -> SyncConsumer:
        consumer = self._portal.call(
            self._client.consumer(
                pchannel, term, policy, filters, time_ticks=time_ticks, end_offset=end_offset
            )
        )
        return SyncConsumer(self._portal, consumer, timeout)

    def close(self) -> None:
        self._portal.call(self._client.close())
        self._portal.stop()

    def __enter__(self) -> SyncNodeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
