"""The store's RocksDB WAL files, made durable with `os.fdatasync`, which releases the GIL.

rocksdict's `write` holds the GIL for the whole RocksDB write, and with `sync=True` that
includes the WAL's fdatasync: a node's event loop, its probe port's threads and every
other Python thread stood still for each fsync, however the write was handed to a thread
(gdb on a follower whose disk stalled for 3 s: the loop and the probe server waiting in
`take_gil`, the synced writer in `rocksdb_write` -> `fdatasync`). So synced writes are
made in two steps (log_store.py): the write without sync (the records reach the WAL file
in the page cache, as RocksDB writes its log at every write group), then `sync()` here,
which fdatasyncs the WAL files that may hold them, off the GIL.

Which files: the newest WAL when the last sync ran, and every WAL created since. RocksDB
creates a WAL (or renames a recycled one) at a memtable switch, inside a write, so a new
file that holds a batch appears before that batch's write returns; an inotify watch on
the directory (IN_CREATE, IN_MOVED_TO) reports it before `sync()` looks, and only then is
the directory listed again and fsynced (the new name must survive a power loss too).
An fdatasync that fails poisons the WAL: its pages may have been dropped as clean, so no
later sync can vouch for them; every sync raises the first error until the store is
reopened (RocksDB treats a failed WAL sync the same way).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from streamwal.files import fsync_dir
from streamwal.node import inotify

log = logging.getLogger(__name__)


class WalFiles:
    """The WAL files of one RocksDB directory; `sync` from any thread."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._lock = threading.Lock()
        # Non-blocking: readable when a file appears. Without one (the user's inotify
        # instances used up: 128 by default, shared by a host's containers of one uid)
        # the directory is listed at every sync: slower, as safe.
        self._watch: int | None = None
        try:
            self._watch = inotify.watch(
                self.dir, inotify.IN_CREATE | inotify.IN_MOVED_TO, os.O_NONBLOCK
            )
        except OSError as exc:
            log.warning(
                "no inotify watch on the WAL's directory: listing it at every sync",
                extra={"directory": str(self.dir), "error": str(exc)},
            )
        self._files: dict[int, int] = {}  # log number -> read-only descriptor
        self._newest = -1  # the newest log number when the last sync ran
        self._failed: OSError | None = None
        self._dir_due = self._rescan()  # the names found must be durable too

    def _rescan(self) -> bool:
        """Open the WAL files that appeared, close the ones that went; True when one
        appeared (its name must be made durable)."""
        found = {}
        for name in os.listdir(self.dir):
            stem, dot, ext = name.partition(".")
            if ext == "log" and dot and stem.isdigit():
                found[int(stem)] = name
        for number in [n for n in self._files if n not in found]:
            os.close(self._files.pop(number))
        appeared = False
        for number, name in found.items():
            if number not in self._files:
                try:
                    self._files[number] = os.open(self.dir / name, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:  # deleted or recycled under us: seen next time
                    continue
                appeared = True
        return appeared

    def _appeared(self) -> bool:
        """Whether a WAL file was created in (or moved into) the directory since last
        asked (tables, manifests and logs come and go too: they need no sync here)."""
        if self._watch is None:
            return True
        seen = False
        while True:
            try:
                events = os.read(self._watch, 65536)
            except BlockingIOError:
                return seen
            for mask, name in inotify.events(events):
                seen = seen or name.endswith(b".log") or bool(mask & inotify.IN_Q_OVERFLOW)

    def sync(self) -> None:
        """Everything written to the WAL so far is durable when this returns."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            try:
                if self._appeared() and self._rescan():
                    self._dir_due = True
                if self._dir_due:
                    fsync_dir(self.dir)
                    self._dir_due = False
                due = [fd for n, fd in self._files.items() if n >= self._newest]
                for fd in due:
                    os.fdatasync(fd)
            except OSError as exc:
                self._failed = exc
                raise
            self._newest = max(self._files, default=-1)

    def close(self) -> None:
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()
            if self._watch is not None:
                os.close(self._watch)
