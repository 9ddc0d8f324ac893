"""Group commit: writes that arrive while one is in flight share the next fsync.

Callers hand over prepared items; one writer drains everything pending into a single
RocksDB WriteBatch (filled by the owner's `prepare`), writes it (with sync, by default)
on the store's writer thread (node/store_thread.py: the one thread that writes the WAL off
the loop) so the event loop keeps accepting requests, and then completes them
all together. A WriteBatch lands whole or not at all, so a failed group is failed back
to every caller in it and nothing is half-written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from rocksdict import WriteBatch

from streamwal.errors import OnShutdown
from streamwal.node.log_store import LogStore
from streamwal.node.store_thread import StoreThread

# A lone write up to this size runs on the event loop (see GroupCommitter).
INLINE_WRITE_BYTES = 64 * 1024
# A write slower than this means the disk is stalling (memtable flushes, writeback):
# writes then stay off the loop for SLOW_DISK_HOLD_S after the last slow one.
SLOW_WRITE_S = 0.002
SLOW_DISK_HOLD_S = 1.0


class InlineRule:
    """Whether a write may run on the event loop itself.

    A lone small write runs inline: handing it to a worker thread and back cost more
    than its fsync (~0.2 ms of a ~0.4 ms write here). But the loop serves nothing while
    an inline fsync runs: no consumer, no other producer, no health check. After bulk
    writes this VM's fsyncs took 10-65 ms for seconds at a time, so once a write is
    slow, writes go to the worker thread until the disk has been fast for a while.
    """

    def __init__(self, slow_s: float = SLOW_WRITE_S, hold_s: float = SLOW_DISK_HOLD_S) -> None:
        self._slow_s = slow_s
        self._hold_s = hold_s
        self._threaded_until = 0.0

    def inline(self, now: float, size: int, contended: bool) -> bool:
        return not contended and size <= INLINE_WRITE_BYTES and now >= self._threaded_until

    def observe(self, now: float, seconds: float) -> None:
        if seconds > self._slow_s:
            self._threaded_until = now + self._hold_s


class Item(Protocol):
    future: asyncio.Future
    channel: Any  # what the item writes to: a group that cannot be prepared is split by it


class GroupCommitter:
    """At most one write in flight; what arrives meanwhile forms the next group.

    A write starts at the end of the event-loop turn in which its first item was
    submitted (a callback, not a task) and finishes in the write's callback: every frame
    that arrived in that turn joins the group, and a one-at-a-time producer pays no
    task switch between its request and its fsync, or between the fsync and its answer
    (each switch costs tens of µs). When
    nothing queued up behind the previous write and the group is small, the write runs
    on the loop itself: the hand-off to a worker thread and back costs more than the
    fsync (~0.2 ms of a ~0.4 ms write here), and there is nobody for the loop to serve
    meanwhile. As soon as requests queue up behind writes, or a write was slow
    (`InlineRule`), writes go to the worker thread again, so the loop keeps parsing the
    next group and serving consumers while the disk syncs. `prepare` returns True for a
    group that must not be written on the loop: a replicated leader streams the group's
    records to its followers while its own fsync runs, and a node that follows some
    pchannel keeps sending its leaders heartbeats.
    """

    def __init__(
        self,
        store: LogStore,
        thread: StoreThread,
        prepare: Callable[[list[Any], WriteBatch], bool],
        on_committed: Callable[[list[Any]], None],
        on_failed: Callable[[list[Any], BaseException], None],
        observe_write: Callable[[float], None] = lambda seconds: None,
        rule: InlineRule | None = None,
    ) -> None:
        self._store = store
        self._thread = thread
        self._pending: list[Any] = []
        self._prepare = prepare
        self._on_committed = on_committed
        self._on_failed = on_failed
        self._observe_write = observe_write
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing = False
        self._contended = False  # requests queued up behind the last write
        self._rule = rule or InlineRule()
        self._idle: asyncio.Event | None = None
        self._closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(self, item: Item) -> None:
        if self._closed:
            item.future.set_exception(OnShutdown("node is shutting down"))
            return
        self._pending.append(item)
        if not self._writing:
            # Start the write at the end of this turn of the event loop, not now: frames
            # that arrived together (a producer's pipelined sends, several producers) are
            # all parsed in this turn and share the write, instead of taking a blocking
            # fsync each in turn while the rest wait behind them.
            self._writing = True
            self._idle.clear()
            self._loop.call_soon(self._write_pending)

    async def close(self) -> None:
        """Write what is pending, then stop."""
        self._closed = True
        if self._idle is not None:
            await self._idle.wait()

    def _write_pending(self) -> None:
        assert self._loop is not None and self._idle is not None
        group, self._pending = self._pending, []
        self._writing = True
        self._idle.clear()
        wb = self._store.new_batch()
        try:
            offload = self._prepare(group, wb)
        except Exception:
            self._write_apart(group)
            return
        started = time.perf_counter()
        if not offload and self._rule.inline(started, wb.size_in_bytes(), self._contended):
            try:
                self._store.write(wb)
            except Exception as exc:
                self._written(exc, group, started)
            else:
                self._written(None, group, started)
            return
        self._thread.run(
            lambda: self._store.write(wb), lambda _, exc: self._written(exc, group, started)
        )

    def _write_apart(self, group: list[Any]) -> None:
        """A group whose items could not be prepared together (one item out of range, a
        bug): each channel's items are prepared and written on their own, on the loop, so
        only the channel whose items fail is failed, with its items queued behind them
        (they hold later offsets), and the other channels of the group commit."""
        parts: dict[int, list[Any]] = {}
        for item in group:
            parts.setdefault(id(item.channel), []).append(item)
        for part in parts.values():
            wb = self._store.new_batch()
            try:
                self._prepare(part, wb)
                self._store.write(wb)
            except Exception as exc:
                channel = part[0].channel
                behind = [i for i in self._pending if i.channel is channel]
                self._pending = [i for i in self._pending if i.channel is not channel]
                self._on_failed(part + behind, exc)
            else:
                self._on_committed(part)
        self._next()

    def _written(self, exc: BaseException | None, group: list[Any], started: float) -> None:
        if exc is not None:  # disk full, I/O error: nothing of the group landed
            # Items queued behind the group hold later offsets; writing them would
            # leave a hole, so they fail too and the owner rewinds to what is durable.
            failed, self._pending = group + self._pending, []
            self._on_failed(failed, exc)
        else:
            done = time.perf_counter()
            self._rule.observe(done, done - started)
            self._observe_write(done - started)
            self._on_committed(group)
        self._next()

    def _next(self) -> None:
        """A write is over: start the next group, or be idle."""
        self._writing = False
        self._contended = bool(self._pending)
        if self._pending:
            self._write_pending()
        else:
            self._idle.set()
