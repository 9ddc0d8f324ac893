"""The acknowledged-offset ledger: per pchannel, the log end this node has acknowledged.

Why it exists: RocksDB's WAL recovery (point-in-time, the mode WAL recycling needs) stops
at the first damaged WAL record and drops everything after it without an error. The
records after a flipped byte were acknowledged, and a node that trusted its recovered
log end would acknowledge their offsets again to other messages. The ledger lives in its
own file, outside RocksDB, so the fault that damages the store's WAL or tables cannot
also lower the ledger: at start-up a log that ends below its ledger mark lost
acknowledged records (Wal marks the pchannel damaged instead of serving it).

Layout: a memory-mapped file of fixed 256-byte slots, one per pchannel, never moved:
  u64 mark (big-endian, 8-byte aligned) | u8 name length | name (<= 200 bytes) | u32 crc
  | (at 216) u64 ceiling
The name and its CRC are written and fsynced once, when the slot is allocated; after
that only the mark changes, with one aligned 8-byte store into the mapping. A store
cannot be torn by a process kill, and the mapping is the page cache, so the mark
survives kill -9 without a system call on the append path. `sync()` (an fdatasync of
the file) makes it survive a power loss too; until then a power loss can only bring
back an older, lower mark, which weakens the check for a moment but never raises a false
alarm, because the records a mark covers were durable before the mark was stored.

The ceiling serves async durability, where a power loss takes acknowledged records by
design (the last second): every offset a single-replica pchannel acknowledged is below
its ceiling, which is synced before any acknowledgement above the previous one (raised a
reservation at a time). After an unclean stop the log continues at the ceiling, so an
offset acknowledged before a power loss is never acknowledged again to another message.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from pathlib import Path

from streamwal.files import fsync_dir

SLOT = 256
MAX_NAME = 200
FILE_NAME = "streamwal-acked"
_MARK = struct.Struct(">Q")
_CRC = struct.Struct(">I")
_CEILING_AT = 216
_GROW_SLOTS = 64  # the file grows by this many slots at a time


class LedgerError(Exception):
    """The ledger file cannot be used (a slot's name fails its checksum, a bad size)."""


class AckLedger:
    """Marks per pchannel name; `advance` is the hot path (no system call)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self.existed = self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self.existed:
            fsync_dir(self.path.parent)
        size = os.fstat(self._fd).st_size
        if size % SLOT:
            raise LedgerError(f"{self.path}: size {size} is not a multiple of {SLOT}")
        # `sync` runs in a worker thread (Wal's ledger loop) and syncs the file, never the
        # mapping, which `slot` may replace on the event loop meanwhile.
        self._map: mmap.mmap | None = None
        self._capacity = 0
        self._slots: dict[str, int] = {}
        self._used = 0
        self.unsynced = False  # slots allocated but not synced yet (`sync_slots`)
        if size:
            self._remap(size // SLOT)
            self._load()

    def _remap(self, capacity: int) -> None:
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self._fd, capacity * SLOT)
        self._capacity = capacity

    def _load(self) -> None:
        assert self._map is not None
        for i in range(self._capacity):
            at = i * SLOT
            length = self._map[at + 8]
            if length == 0:
                break  # slots are allocated in order: the first empty one ends the list
            if length > MAX_NAME:
                raise LedgerError(f"{self.path}: slot {i} has a name of {length} bytes")
            raw = bytes(self._map[at + 9 : at + 9 + length])
            (crc,) = _CRC.unpack_from(self._map, at + 9 + MAX_NAME)
            if zlib.crc32(raw) != crc:
                raise LedgerError(f"{self.path}: slot {i}'s name fails its checksum")
            self._slots[raw.decode()] = at
            self._used = i + 1

    def names(self) -> list[str]:
        return list(self._slots)

    def untouched(self, name: str) -> bool:
        """Whether `name`'s slot holds nothing: no mark, no ceiling (nothing was ever
        acknowledged under it). An Assign of a pchannel new to this node that failed
        after its slot was made leaves such a slot, which cannot be freed (slots are
        never moved)."""
        return not self.mark(name) and not self.ceiling(name)

    def mark(self, name: str) -> int | None:
        """The acknowledged end of `name`, or None when the ledger never saw it."""
        at = self._slots.get(name)
        if at is None:
            return None
        assert self._map is not None
        return _MARK.unpack_from(self._map, at)[0]

    def slot(self, name: str, mark: int = 0, durable: bool = True) -> int:
        """The slot of `name`, allocated (with `mark`) when it has none yet: durable on
        return, or with `durable=False` once `sync_slots` returns (slots allocated
        together share its one sync: a failover's Assign batch of hundreds of pchannels
        new to this node synced each slot on its own, a second on a busy machine)."""
        at = self._slots.get(name)
        if at is not None:
            return at
        raw = name.encode()
        if not raw or len(raw) > MAX_NAME:
            raise LedgerError(f"pchannel name of {len(raw)} bytes: 1..{MAX_NAME}")
        if self._used == self._capacity:
            os.ftruncate(self._fd, (self._capacity + _GROW_SLOTS) * SLOT)
            self._remap(self._capacity + _GROW_SLOTS)
        assert self._map is not None
        at = self._used * SLOT
        _MARK.pack_into(self._map, at, mark)
        self._map[at + 9 : at + 9 + len(raw)] = raw
        _CRC.pack_into(self._map, at + 9 + MAX_NAME, zlib.crc32(raw))
        self._map[at + 8] = len(raw)  # last: a name without its length is no slot
        self._slots[name] = at
        self._used += 1
        self.unsynced = True
        if durable:
            self.sync_slots()
        return at

    def sync_slots(self) -> None:
        """Every slot allocated so far survives a power loss once this returns (their
        names and the file's size). Raises OSError, and is due again, if it failed."""
        if self.unsynced:
            os.fsync(self._fd)
            self.unsynced = False

    def advance(self, at: int, mark: int) -> None:
        """Raise the mark of slot `at` to `mark` (never lowers it)."""
        m = self._map
        assert m is not None
        if _MARK.unpack_from(m, at)[0] < mark:
            _MARK.pack_into(m, at, mark)

    def ceiling(self, name: str) -> int:
        at = self._slots.get(name)
        if at is None:
            return 0
        assert self._map is not None
        return _MARK.unpack_from(self._map, at + _CEILING_AT)[0]

    def set_ceiling(self, at: int, ceiling: int, durable: bool = True) -> None:
        """Store the ceiling of slot `at`; durable before return unless told otherwise
        (a clean shutdown stores them all, then syncs once)."""
        assert self._map is not None
        _MARK.pack_into(self._map, at + _CEILING_AT, ceiling)
        if durable:
            self.sync()

    def lower(self, at: int, mark: int) -> None:
        """Set the mark of slot `at` to `mark`, durably, before a log end moves back
        (a divergent suffix cut, a damaged log rebuilt, data loss accepted)."""
        assert self._map is not None
        _MARK.pack_into(self._map, at, mark)
        self.sync()

    def sync(self) -> None:
        """Every mark stored so far survives a power loss once this returns (from any
        thread). An fdatasync of the file writes the mapping's dirty pages (they are the
        file's page cache) and releases the GIL; `mmap.flush` (msync) holds it, and a disk
        that stalls then stalls every thread of the node (wal_files.py says the same of
        rocksdict's synced writes)."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        self.sync()
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self._fd)
