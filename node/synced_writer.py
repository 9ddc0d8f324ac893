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

A lone small write with nothing queued behind the last one runs on the event loop, as the
group commit's do (group_commit.InlineRule): a follower acknowledging one-at-a-time sends
then pays its fsync, not two thread hand-offs besides (each a wake-up that waits for a
core when the machine is busy). Writes submitted in one loop turn still share a flush,
and as soon as writes queue up behind a flush, or one was slow, they go to the thread.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from rocksdict import WriteBatch

from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.group_commit import InlineRule
from streamwal.node.log_store import LogStore


class SyncedWriter:
    def __init__(self, store: LogStore, rule: InlineRule | None = None) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="synced-writer")
        self._pending: list[tuple[WriteBatch, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task | None = None
        self._starting = False  # a flush starts at the end of this loop turn
        self._contended = False  # writes queued up behind the last flush
        self._rule = rule or InlineRule()
        self.flushes = 0  # synced writes made (for tests)

    def write(self, wb: WriteBatch) -> asyncio.Future[None]:
        """A future that resolves once `wb` is durable (or fails with the write's error)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((wb, done))
        if (self._flusher is None or self._flusher.done()) and not self._starting:
            self._starting = True
            loop.call_soon(self._start)
        return done

    def _start(self) -> None:
        """End of the turn: one lone small write on the loop, anything else on the thread."""
        self._starting = False
        if not self._pending or (self._flusher is not None and not self._flusher.done()):
            return
        if len(self._pending) == 1:
            wb, done = self._pending[0]
            started = time.perf_counter()
            if self._rule.inline(started, wb.size_in_bytes(), self._contended):
                self._pending = []
                try:
                    self.store.write_synced_many([wb])
                except Exception as exc:
                    _settle([(wb, done)], exc)
                    return
                self.flushes += 1
                self._rule.observe(time.perf_counter(), time.perf_counter() - started)
                _settle([(wb, done)], None)
                return
        self._flusher = asyncio.create_task(self._flush(), name="synced-writer")

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
            started = time.perf_counter()
            try:
                await loop.run_in_executor(
                    self._executor, self.store.write_synced_many, [wb for wb, _ in batch]
                )
                self.flushes += 1
                self._rule.observe(time.perf_counter(), time.perf_counter() - started)
            except Exception as exc:
                error = exc
            self._contended = bool(self._pending)
            _settle(batch, error)

    async def close(self) -> None:
        """Finish what is pending, then let the thread go."""
        if self._pending and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._flush(), name="synced-writer")
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._executor.shutdown(wait=False)


def _settle(batch: list[tuple[WriteBatch, asyncio.Future[None]]], error: Exception | None) -> None:
    for _, done in batch:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
