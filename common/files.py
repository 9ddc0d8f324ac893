"""File-system helpers shared by the coord's meta store and the node's files."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make the entries of `directory` durable (a file created, renamed or removed in it):
    a file's own fsync does not cover its name."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
