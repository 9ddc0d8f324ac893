"""The store's WAL syncs (node/wal_files.py): off the GIL, and a failure is final."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from streamwal.node.log_store import LogStore, StoreUnwritable


def _put(store: LogStore, key: bytes) -> None:
    wb = store.new_batch()
    wb.put(key, b"v")
    store.write_synced(wb)


def test_a_failed_wal_sync_fails_every_later_one(tmp_path, monkeypatch) -> None:
    """After a failed fdatasync the kernel may have dropped the WAL's pages as clean: no
    later sync can vouch for them (RocksDB's own synced writes stop the same way)."""
    store = LogStore(tmp_path / "s")
    try:
        _put(store, b"a")

        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "injected")

        real = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(StoreUnwritable, match="injected"):
            _put(store, b"b")
        monkeypatch.setattr(os, "fdatasync", real)
        with pytest.raises(StoreUnwritable, match="injected"):
            _put(store, b"c")
    finally:
        store.close()


def test_a_synced_write_lets_other_threads_run_during_its_fsync(tmp_path, monkeypatch) -> None:
    """rocksdict holds the GIL through a synced RocksDB write: the store syncs its WAL
    itself, and another thread runs meanwhile (here the fsync is made to take 0.3 s)."""
    store = LogStore(tmp_path / "s")
    real = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.3)  # releases the GIL, as the real call does
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    try:
        writer = threading.Thread(target=_put, args=(store, b"a"))
        started = time.monotonic()
        writer.start()
        turns, deadline = 0, started + 10
        while writer.is_alive() and time.monotonic() < deadline:
            turns += 1
        writer.join(10)
        took = time.monotonic() - started
        assert took >= 0.3, f"the write took {took:.3f}s: its sync was not the store's"
        assert turns > 10_000, f"this thread ran {turns} times while the write synced"
    finally:
        store.close()


def test_without_an_inotify_watch_the_directory_is_listed_at_each_sync(
    tmp_path, monkeypatch
) -> None:
    """inotify instances run out (128 per user by default, shared by a host's containers
    of one uid): the store still opens, and a sync still finds a WAL made since."""
    from streamwal.node import inotify

    def used_up(*_args) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(inotify, "watch", used_up)
    store = LogStore(tmp_path / "s")
    try:
        _put(store, b"a")
        store._db.flush()  # a memtable switch: a new WAL file
        _put(store, b"b")
        logs = [int(n.split(".")[0]) for n in os.listdir(tmp_path / "s") if n.endswith(".log")]
        assert max(store.wal._files) == max(logs)
    finally:
        store.close()
