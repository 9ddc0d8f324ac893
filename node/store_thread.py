"""The one thread that writes a store's WAL off the event loop.

The group commit's threaded writes and the synced writer's flushes (metas, a follower's
copied records) used to run on two threads: the default executor's and one of the synced
writer's own. Each is a RocksDB write followed by an fdatasync of the WAL
(node/wal_files.py), so one thread's RocksDB write could run while the other's fsync was
on the disk. rocksdict holds the GIL for the whole RocksDB write, and where a write to a
file waits for that file's fsync (a FUSE file system: the kernel holds the file's lock
through FUSE_FSYNC; a device that needs stable pages waits on the page being written
back), that write held every thread of the node, its event loop and probe answers
included, for as long as the disk stalled (tests/nemesis/test_slow_disk.py: a node that
leads one pchannel and follows another, its disk stalled for 3 s, stopped answering, and
the pchannel it followed was failed over to it). On one thread a write never overlaps
the WAL's fsync: the next job starts only when the last one's fsync has returned.

Jobs run in the order they are handed over; each one's outcome goes back to the loop
with one `call_soon_threadsafe` (a `SimpleQueue` hand-off: an executor's futures cost a
follower ~25 µs more CPU per synced write, docs/benchmarks.md, "A send alone").
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

# A job: what runs on the thread, and what the loop is told of its outcome (its result,
# or None and the exception it raised).
Done = Callable[[Any, Exception | None], None]
_Job = tuple[Callable[[], Any], Done]


class StoreThread:
    def __init__(self, name: str = "store-writer") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started at the first job
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, job: Callable[[], Any], done: Done) -> None:
        """Run `job` on the thread after every job handed over before it; `done` is
        called on the loop with its outcome."""
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((job, done))

    def call(self, job: Callable[[], Any]) -> asyncio.Future[Any]:
        """`run` for a caller that awaits the outcome."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.run(job, lambda result, error: settle(future, result, error))
        return future

    def close(self) -> None:
        """Let the thread go once the jobs handed over so far have run (their outcomes
        reach the loop only while it runs)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _work(self) -> None:
        loop = self._loop
        assert loop is not None
        while (item := self._jobs.get()) is not None:
            job, done = item
            result: Any = None
            error: Exception | None = None
            try:
                result = job()
            except Exception as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(done, result, error)
            except RuntimeError:  # the loop closed: nobody waits for the outcome
                return


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """A job's outcome into `future`, unless its waiter gave up on it already."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
