"""Starts the disk writes of RocksDB's new table files while they are being written.

A flush or compaction writes its table through the page cache and fsyncs it at the end,
so a 64 MiB memtable reached the disk at once, at that fsync, and every WAL fsync of the
node (and of the other nodes on the same disk) queued behind it: a replicated produce run
stopped for 100-250 ms at each memtable switch (docs/decisions-tails.md). RocksDB's own
remedy, `bytes_per_sync`, does nothing with the rocksdict wheel (its RocksDB is built
without sync_file_range), and direct I/O for flushes would keep a new table out of the
page cache, so a consumer catching up reads it back from the disk (2-3x slower here).

So a thread of the node watches the store's directory (inotify: no work while nothing is
written) and, while a table file grows, asks the kernel every few milliseconds to start
writing what was added (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: it only starts the
writes and waits for nothing). The table stays in the page cache, and its closing fsync
finds little left to write. Durability is RocksDB's as before: it still fsyncs each
table before its MANIFEST names it; this only moves the writes earlier.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import threading
from pathlib import Path

from streamwal.node import inotify

log = logging.getLogger(__name__)

_SYNC_FILE_RANGE_WRITE = 2  # sync_file_range(2): start the writes, wait for nothing
# How often a growing table's new bytes are handed to the disk: at a flush's ~500 MB/s,
# ~5 MB at a time, about what the disk takes in the same few milliseconds.
INTERVAL_S = 0.01
TABLE_SUFFIX = b".sst"
_MASK = inotify.IN_CREATE | inotify.IN_MOVED_TO | inotify.IN_CLOSE_WRITE | inotify.IN_DELETE


class TableWriteback:
    """Watches `directory` from a daemon thread of its own until `close()`. Where inotify
    or sync_file_range is missing (not Linux), `start()` says so and returns False: the
    store works as before, its tables reaching the disk at their fsync."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._inotify = -1
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        if not hasattr(inotify.libc, "sync_file_range"):
            log.warning("no sync_file_range: tables reach the disk at their fsync")
            return False
        try:
            self._inotify = inotify.watch(self.directory, _MASK)
        except (OSError, AttributeError) as exc:  # AttributeError: no inotify in this libc
            log.warning(
                "cannot watch %s (%s): tables reach the disk at their fsync", self.directory, exc
            )
            return False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="table-writeback", daemon=True)
        self._thread.start()
        return True

    def close(self) -> None:
        if self._thread is None:
            return
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._thread = None
        for fd in (self._inotify, self._wake_r, self._wake_w):
            os.close(fd)

    def _run(self) -> None:
        growing: dict[bytes, list[int]] = {}  # table name -> [fd, bytes handed to the disk]
        poller = select.poll()
        poller.register(self._inotify, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                timeout = int(INTERVAL_S * 1000) if growing else None
                ready = {fd for fd, _ in poller.poll(timeout)}
                if self._wake_r in ready:
                    return
                if self._inotify in ready:
                    self._events(growing)
                for state in growing.values():
                    self._push(state)
        finally:
            for fd, _ in growing.values():
                os.close(fd)

    def _events(self, growing: dict[bytes, list[int]]) -> None:
        for mask, name in inotify.events(os.read(self._inotify, 64 * 1024)):
            if not name.endswith(TABLE_SUFFIX):
                continue
            if mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO) and name not in growing:
                try:
                    fd = os.open(self.directory / os.fsdecode(name), os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue  # gone already
                growing[name] = [fd, 0]
            elif mask & (inotify.IN_CLOSE_WRITE | inotify.IN_DELETE) and name in growing:
                os.close(growing.pop(name)[0])

    def _push(self, state: list[int]) -> None:
        """Start the disk writes of what the table gained since the last time."""
        fd, done = state
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return
        if size <= done:
            return
        # A failure (the file went away) only means this table is synced the old way.
        inotify.libc.sync_file_range(
            fd, ctypes.c_int64(done), ctypes.c_int64(size - done), _SYNC_FILE_RANGE_WRITE
        )
        state[1] = size
