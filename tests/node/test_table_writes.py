"""A flushed table goes to the disk as it is written (direct I/O), not through the page
cache where its fsync would queue it all at once ahead of the WAL's syncs; a directory
that refuses O_DIRECT still gets a working store."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
from pathlib import Path

import pytest

from streamwal.node import log_store
from streamwal.node.log_store import LogStore

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
linux_only = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


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


def _table_after_a_flush(path: Path) -> Path:
    store = LogStore(path)
    try:
        wb = store.new_batch()
        for i in range(64):
            LogStore.put_record(wb, "p", i, os.urandom(64 * 1024))
        store.write(wb)
        store._db.flush()
    finally:
        store.close()
    (table,) = path.glob("*.sst")
    return table


@linux_only
def test_a_flushed_table_bypasses_the_page_cache(tmp_path: Path) -> None:
    assert log_store.direct_io_works(tmp_path)
    table = _table_after_a_flush(tmp_path / "db")
    assert _cached_fraction(table) < 0.1
    assert not (tmp_path / "db" / log_store._DIRECT_IO_PROBE).exists()


@linux_only
def test_a_directory_without_direct_io_gets_a_buffered_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(log_store.os, "open", no_direct)
    assert not log_store.direct_io_works(tmp_path)
    with caplog.at_level(logging.WARNING, logger=log_store.__name__):
        table = _table_after_a_flush(tmp_path / "db")
    assert "takes no direct I/O" in caplog.text
    # Written through the page cache, as before: the store works, its table is cached.
    assert _cached_fraction(table) > 0.9
