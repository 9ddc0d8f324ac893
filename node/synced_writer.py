"""Synced writes, coalesced: the ones made while a write is on the disk share one fsync.

Fence, assign and remove persist a pchannel's meta before they answer (a fence must hold
across a crash), and a follower syncs every batch of records it copies before it
acknowledges them. One at a time, each was a synced RocksDB write on the shared
executor: at a few hundred replicated pchannels the followers' idle time ticks alone
were hundreds of fsyncs a second per node, the executor's queue grew, and fences (which
wait for the pchannel's writes) answered after the coord's deadline, every attempt
(issue 24). Here every synced write submitted while one is on the disk goes out in the
next flush: all but the last unsynced, the last synced, which makes the WAL durable up
to it (RocksDB's log is sequential). A burst of N costs about two fsyncs, not N. Each
caller's future resolves only once its own batch is durable. The flushes run on a thread
of their own, so no data read queued on the shared executor delays a fence.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from rocksdict import WriteBatch

from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.log_store import LogStore


class SyncedWriter:
    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="synced-writer")
        self._pending: list[tuple[WriteBatch, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task | None = None
        self.flushes = 0  # synced writes made (for tests)

    def write(self, wb: WriteBatch) -> asyncio.Future[None]:
        """A future that resolves once `wb` is durable (or fails with the write's error)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((wb, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="synced-writer")
        return done

    async def save_meta(self, name: str, meta: ChannelMeta) -> None:
        """Returns once `meta` is durable, whatever the append durability."""
        wb = self.store.new_batch()
        self.store.put_meta(wb, name, meta)
        await self.write(wb)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            error: Exception | None = None
            try:
                await loop.run_in_executor(
                    self._executor, self.store.write_synced_many, [wb for wb, _ in batch]
                )
                self.flushes += 1
            except Exception as exc:
                error = exc
            for _, done in batch:
                if done.done():
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    async def close(self) -> None:
        """Finish what is pending, then let the thread go."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._executor.shutdown(wait=False)
