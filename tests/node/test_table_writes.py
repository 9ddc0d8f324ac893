"""A table RocksDB writes reaches the disk while it is being written, not all at once at
its fsync (where the node's WAL syncs queued behind it), and stays in the page cache for
the consumers that read it next."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from pathlib import Path

import pytest

from streamwal.node.log_store import LogStore
from streamwal.node.table_writeback import TableWriteback

MIB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_CACHESTAT = 451  # cachestat(2), Linux 6.5; the same number on every architecture
linux_only = pytest.mark.skipif(not Path("/proc/self").exists(), reason="Linux's inotify")


def _dirty_pages(fd: int) -> int:
    """Pages of the file not yet handed to the disk (cachestat's nr_dirty)."""
    span = struct.pack("QQ", 0, 0)  # the whole file
    out = ctypes.create_string_buffer(5 * 8)
    if _libc.syscall(_CACHESTAT, fd, span, out, 0) != 0:
        pytest.skip(f"no cachestat here: {os.strerror(ctypes.get_errno())}")
    return struct.unpack("5Q", out.raw)[1]


def _cached_fraction(path: Path) -> float:
    """The share of `path`'s pages in the page cache (mincore over a mapping of it)."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)  # a private mapping: nothing is written back
        vec = ctypes.create_string_buffer(pages)
        try:
            if _libc.mincore(ctypes.addressof(anchor), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del anchor
    return sum(b & 1 for b in vec.raw) / pages


@linux_only
def test_a_growing_table_is_handed_to_the_disk_before_its_fsync(tmp_path: Path) -> None:
    watcher = TableWriteback(tmp_path)
    assert watcher.start()
    try:
        fd = os.open(tmp_path / "000007.sst", os.O_WRONLY | os.O_CREAT, 0o600)
        other = os.open(tmp_path / "000008.log", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            chunk = os.urandom(MIB)
            for _ in range(16):  # written as a flush writes it, a piece at a time
                os.write(fd, chunk)
                os.write(other, chunk)
                time.sleep(0.005)
            deadline = time.monotonic() + 2.0
            while _dirty_pages(fd) > 16 * MIB // mmap.PAGESIZE // 8:
                assert time.monotonic() < deadline, "the table's pages are still dirty"
                time.sleep(0.01)
            # Only tables: the WAL is RocksDB's to sync, and this one was never synced.
            assert _dirty_pages(other) > 16 * MIB // mmap.PAGESIZE // 2
        finally:
            os.close(fd)
            os.close(other)
    finally:
        watcher.close()


@linux_only
def test_a_flushed_table_stays_in_the_page_cache(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "db")
    try:
        wb = store.new_batch()
        for i in range(64):
            LogStore.put_record(wb, "p", i, os.urandom(64 * 1024))
        store.write(wb)
        store._db.flush()
    finally:
        store.close()
    (table,) = (tmp_path / "db").glob("*.sst")
    assert _cached_fraction(table) > 0.9  # a consumer catching up reads it from memory
