"""Blocking twin of `streamwal.client.wal`: `connect_sync(coord=...)` for scripts.

It drives the one asyncio implementation from a private event-loop thread (the portal of
`client/sync.py`), so routing, rerouting and resends behave exactly as in the async client.

    with connect_sync("127.0.0.1:19500") as wal:
        producer = wal.producer("pchannel_0_v1")
        producer.send(b"hello")
        for message in wal.consumer("pchannel_0_v1", end_offset=wal.end_offset("pchannel_0")):
            ...
"""

from __future__ import annotations

from collections.abc import Sequence

from streamwal.client.discovery import Route
from streamwal.client.sync import SyncConsumer, SyncProducer, _Portal
from streamwal.client.wal import WAL, connect
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import TransportConfig


class SyncWAL:
    """`WAL`'s methods, blocking."""

    def __init__(self, portal: _Portal, wal: WAL) -> None:
        self._portal = portal
        self._wal = wal

    def assignments(self) -> dict[str, Route]:
        return self._wal.assignments()

    def producer(self, channel: str, *, producer_id: str | None = None, **options) -> SyncProducer:
        opened = self._wal.producer(channel, producer_id=producer_id, **options)
        return SyncProducer(self._portal, self._portal.call(opened))

    def consumer(
        self,
        channel: str,
        policy: pb.DeliverPolicy | None = None,
        filters: Sequence[pb.DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
        timeout: float | None = None,
    ) -> SyncConsumer:
        """`timeout` bounds each wait for the next batch (None: wait forever)."""
        consumer = self._portal.call(
            self._wal.consumer(
                channel, policy, filters, time_ticks=time_ticks, end_offset=end_offset
            )
        )
        return SyncConsumer(self._portal, consumer, timeout)

    def end_offset(self, pchannel: str) -> int:
        return self._portal.call(self._wal.end_offset(pchannel))

    def close(self) -> None:
        try:
            self._portal.call(self._wal.close())
        finally:
            self._portal.stop()

    def __enter__(self) -> SyncWAL:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect_sync(
    coord: str,
    *,
    timeout: float = 10.0,
    failover_timeout: float = 30.0,
    transport: TransportConfig | None = None,
) -> SyncWAL:
    """Blocking `connect`: see `streamwal.client.wal.connect`."""
    portal = _Portal()
    try:
        wal = portal.call(
            connect(coord, timeout=timeout, failover_timeout=failover_timeout, transport=transport)
        )
    except BaseException:
        portal.stop()
        raise
    return SyncWAL(portal, wal)
