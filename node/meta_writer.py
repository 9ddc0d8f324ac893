"""Durable pchannel meta writes, coalesced: concurrent ones share one synced WriteBatch.

Fence, assign and remove persist a pchannel's meta before they answer (a fence must hold
across a crash). One at a time, each is a synced RocksDB write: when the coord fences or
assigns a few hundred pchannels on a node at once (a placement, a node loss), those
writes queued up on the executor, one fsync after another, and answers came after the
coord's deadline (issue 24). Here every meta written while a write is on the disk goes
into the next batch: a burst of N costs about two fsyncs, not N. Each caller still
returns only once its own meta is durable; the latest meta of a pchannel wins within a
batch (callers hand them in the order they set them).
"""

from __future__ import annotations

import asyncio

from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.log_store import LogStore


class MetaWriter:
    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._pending: dict[str, ChannelMeta] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task | None = None
        self.batches = 0  # synced writes made (for tests and metrics)

    async def save(self, name: str, meta: ChannelMeta) -> None:
        """Returns once `meta` (or a later meta of `name`) is durable."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[name] = meta
        self._waiters.append(waiter)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="meta-writer")
        await waiter

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, waiters = self._pending, self._waiters
            self._pending, self._waiters = {}, []
            try:
                await loop.run_in_executor(None, self.store.save_metas, batch)
            except Exception as exc:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            self.batches += 1
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
