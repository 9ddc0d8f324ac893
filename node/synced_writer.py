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
caller's future resolves only once its own batch is durable. The flushes run on the
store's writer thread (node/store_thread.py), so no data read queued on the shared
executor delays a fence, and no flush overlaps the group commit's fsync.

Every flush runs on that thread, never on the event loop, although a lone small write
on the loop would save a follower two thread hand-offs (within what the benchmarks
resolve: docs/benchmarks.md, "A follower's synced writes leave the loop"). An fsync on
the loop blocks it for as long as the disk stalls, and a follower whose loop is blocked
sends its leader no heartbeat: a follower whose disk stalled past the quorum lease
(this VM's fsyncs stall for up to a second) made its leader step down, and the coord
then gave the leadership to the stalled follower itself (tests/nemesis/test_slow_disk.py,
about one run in six). On the thread, the fsync (`os.fdatasync`, off the GIL:
node/wal_files.py) leaves the loop serving, and its heartbeats say what is true: the
follower is there, its disk is slow.
"""

from __future__ import annotations

import asyncio

from rocksdict import WriteBatch

from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.log_store import LogStore
from streamwal.node.store_thread import StoreThread, settle

_Batch = list[tuple[WriteBatch, asyncio.Future[None]]]


class SyncedWriter:
    def __init__(self, store: LogStore, thread: StoreThread) -> None:
        self.store = store
        self._thread = thread
        self._pending: _Batch = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing = False  # a flush is on the thread
        self._idle: asyncio.Future[None] | None = None  # close() waits for the last flush
        self._starting = False  # a flush starts at the end of this loop turn
        self.flushes = 0  # synced writes made (for tests)

    def write(self, wb: WriteBatch) -> asyncio.Future[None]:
        """A future that resolves once `wb` is durable (or fails with the write's error)."""
        loop = self._loop = self._loop or asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((wb, done))
        if not self._flushing and not self._starting:
            self._starting = True
            loop.call_soon(self._start)
        return done

    def _start(self) -> None:
        """End of the turn: what the turn submitted goes to the thread as one flush."""
        self._starting = False
        if self._pending and not self._flushing:
            self._flush()

    def _flush(self) -> None:
        """Hand everything pending to the thread, as one synced write."""
        batch, self._pending = self._pending, []
        self._flushing = True
        wbs = [wb for wb, _ in batch]
        self._thread.run(
            lambda: self.store.write_synced_many(wbs),
            lambda _, error: self._flushed(batch, error),
        )

    def _flushed(self, batch: _Batch, error: Exception | None) -> None:
        if error is None:
            self.flushes += 1
        self._flushing = False
        _settle(batch, error)
        if self._pending:  # what came meanwhile goes to the thread at once
            self._flush()
        elif self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def save_meta(self, name: str, meta: ChannelMeta) -> None:
        """Returns once `meta` is durable, whatever the append durability."""
        wb = self.store.new_batch()
        self.store.put_meta(wb, name, meta)
        await self.write(wb)

    async def close(self) -> None:
        """Finish what is pending (the thread is its owner's to close)."""
        if self._pending and not self._flushing:
            self._loop = self._loop or asyncio.get_running_loop()
            self._flush()
        if self._flushing:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle


def _settle(batch: _Batch, error: Exception | None) -> None:
    for _, done in batch:
        settle(done, None, error)
