"""Group commit: writes that arrive while one is in flight share the next fsync.

Callers hand over prepared items; one writer drains everything pending into a single
RocksDB WriteBatch (filled by the owner's `prepare`), writes it (with sync, by default)
in a worker thread so the event loop keeps accepting requests, and then completes them
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


class Item(Protocol):
    future: asyncio.Future


class GroupCommitter:
    def __init__(
        self,
        store: LogStore,
        prepare: Callable[[list[Any], WriteBatch], None],
        on_committed: Callable[[list[Any]], None],
        on_failed: Callable[[list[Any], BaseException], None],
        observe_write: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._store = store
        self._pending: list[Any] = []
        self._wakeup = asyncio.Event()
        self._prepare = prepare
        self._on_committed = on_committed
        self._on_failed = on_failed
        self._observe_write = observe_write
        self._task: asyncio.Task | None = None
        self._closed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def submit(self, item: Item) -> None:
        if self._closed:
            item.future.set_exception(OnShutdown("node is shutting down"))
            return
        self._pending.append(item)
        self._wakeup.set()

    async def close(self) -> None:
        """Write what is pending, then stop."""
        self._closed = True
        self._wakeup.set()
        if self._task:
            await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                if self._closed:
                    return
                continue
            group, self._pending = self._pending, []
            wb = self._store.new_batch()
            self._prepare(group, wb)
            started = time.perf_counter()
            try:
                await loop.run_in_executor(None, self._store.write, wb)
            except Exception as exc:  # disk full, I/O error: nothing of the group landed
                # Items queued behind the group hold later offsets; writing them would
                # leave a hole, so they fail too and the owner rewinds to what is durable.
                failed, self._pending = group + self._pending, []
                self._on_failed(failed, exc)
            else:
                self._observe_write(time.perf_counter() - started)
                self._on_committed(group)
            if self._pending:
                self._wakeup.set()
