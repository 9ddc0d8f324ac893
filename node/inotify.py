"""A directory's inotify(7) watch through ctypes, and the events read from it: the WAL's
new files (wal_files.py) and the tables being written (table_writeback.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000  # events were dropped: look at the directory again
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def watch(directory: Path, mask: int, flags: int = 0) -> int:
    """An inotify descriptor (close-on-exec, plus `flags`) watching `directory` for `mask`."""
    fd = libc.inotify_init1(flags | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"inotify_add_watch {directory}")
    return fd


def events(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(mask, file name) of each event in what one read of the descriptor returned."""
    at = 0
    while at + _EVENT.size <= len(data):
        _, mask, _, size = _EVENT.unpack_from(data, at)
        name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
        at += _EVENT.size + size
        yield mask, name
