"""RocksDB adapter for the node's log: records, per-pchannel meta and size counters.

Key layout (one default column family, ordered by bytes):
  b"l" + name + b"\\0" + offset(8, big-endian) -> record (see records.py), keyed by its base offset
  b"m" + name -> JSON channel meta (fence, term history, retention)
  b"s" + name -> bytes retained, 8 bytes big-endian
  b"p" + name + b"\\0" + producer id -> the idempotent producer's result window
  b"r" + name -> the replicated pchannel's commit offset, 8 bytes big-endian (lazily saved)
  b"c" + name -> base offset(8) + the newest consumer-group cursor record (records.py):
     kept by put_record, the one place every record (append, catch-up copy) is written,
     so reopening a pchannel reads its cursors with one get instead of scanning the log
Recovery seeks to the last record of each pchannel instead of scanning the log.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import (
    DBCompressionType,
    Env,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from streamwal.errors import DataLoss, Inner, StreamingError
from streamwal.node import records
from streamwal.node.channel_meta import ChannelMeta, Tail
from streamwal.node.table_writeback import TableWriteback
from streamwal.node.wal_files import WalFiles

_U64 = struct.Struct(">Q")
_MAX_KEY = b"\xff" * 8
_PREWARM_PREFIX = b"\xfewal-prewarm\0"  # no log, meta or state key starts with 0xfe
_UNSYNCED = WriteOptions()


class StoreCorruption(DataLoss):
    """RocksDB found stored bytes that fail their checksum (or a file it needs is gone)."""


class StoreUnwritable(Inner):
    """RocksDB refused a write: a full, read-only or failing disk (nothing was written)."""


def read_error(exc: Exception) -> StreamingError:
    """The StreamingError for an exception RocksDB raised on a read."""
    text = str(exc)
    if text.startswith("Corruption"):
        return StoreCorruption(f"the store is corrupt: {text}")
    return Inner(f"storage read failed: {text}")


def _finish(it) -> None:
    """Raise what stopped an iterator early: a RocksDB iterator that hits a damaged block
    just turns invalid, and says why only through status(). Every scan ends with this,
    or a damaged block would read as the end of the log."""
    try:
        it.status()
    except Exception as exc:
        raise read_error(exc) from None


@dataclass(frozen=True)
class VerifyStep:
    """How far one step of `LogStore.verify` got: the next offset to verify from, and the
    first problem found at that offset (empty: none so far)."""

    position: int
    problem: str = ""
    store_corrupt: bool = False  # RocksDB itself failed a checksum (salvage.py)


def log_prefix(name: str) -> bytes:
    return b"l" + name.encode() + b"\0"


def log_key(name: str, offset: int) -> bytes:
    return log_prefix(name) + _U64.pack(offset)


def _meta_key(name: str) -> bytes:
    return b"m" + name.encode()


def _size_key(name: str) -> bytes:
    return b"s" + name.encode()


def _commit_key(name: str) -> bytes:
    return b"r" + name.encode()


def _producer_key(name: str, producer_id: str) -> bytes:
    return b"p" + name.encode() + b"\0" + producer_id.encode()


def _cursors_key(name: str) -> bytes:
    return b"c" + name.encode()


def _low_priority_compaction_env() -> Env:
    """RocksDB's default environment with its compaction threads at the lowest CPU
    priority (nice 19; RocksDB's LowerThreadPoolCPUPriority).

    Compactions only tidy what is already durable; the event loop that answers producers
    is what a user waits on. On a 2-core node right after a burst, open-loop rounds that
    overlapped a compaction had p99 1.35 ms at normal priority and 0.70-0.99 ms at low
    (docs/decisions.md). A compaction that falls behind is delayed, not lost: RocksDB
    slows writes once level 0 piles up, which frees the CPU for it. Flushes (the
    high-priority pool) keep their priority: a late flush stalls writes at once. The
    environment is the process's default one, so this holds for every store the process
    opens, which for a node is its one store.
    """
    env = Env()
    env.lower_thread_pool_cpu_priority()
    return env


class LogStore:
    """Thin wrapper over one RocksDB; every method is synchronous (callers pick the thread)."""

    def __init__(
        self,
        path: str | Path,
        *,
        sync: bool = True,
        wal_prewarm_bytes: int = 0,
        low_priority_compaction: bool = False,
    ) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        new_store = not (Path(path) / "CURRENT").exists()
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Stored bytes that fail a checksum are an error, never silently skipped (RocksDB's
        # default, stated because the node relies on it). The WAL recovery mode stays
        # point-in-time (the default, and the one WAL recycling needs): it drops a damaged
        # WAL record and everything after it without an error, which the acknowledged-
        # offset ledger (ack_ledger.py) turns into a detected loss. docs/decisions.md.
        opts.set_paranoid_checks(True)
        opts.set_write_buffer_size(64 * 1024 * 1024)
        opts.set_max_write_buffer_number(4)
        opts.increase_parallelism(2)
        # Payloads are the user's bytes, often compressed already; block compression cost
        # CPU on a 2-core node for little space (bench node produce: 765 k -> 853 k msg/s).
        opts.set_compression_type(DBCompressionType.none())
        # Reuse old WAL files instead of creating new ones: overwriting written blocks lets
        # fdatasync skip the file-size/extent journal commit (raw synced 200-byte writes on
        # this VM: p50 0.29 -> 0.19 ms, p99 0.48-0.59 -> 0.31-0.35 ms). RocksDB tells a
        # recycled file's stale records from new ones by their log number, and keeps
        # recycling only under point-in-time recovery (its default, which we use).
        opts.set_recycle_log_file_num(4)
        if low_priority_compaction:
            opts.set_env(_low_priority_compaction_env())
        self.path = Path(path)
        self._db = Rdict(str(path), opts)
        # Synced writes are an unsynced write and then `wal.sync()`: rocksdict holds the
        # GIL through a synced write's fsync (wal_files.py).
        self.wal = WalFiles(path)
        # Every table RocksDB writes from here on (the pre-warm's too) reaches the disk as
        # it is written, not all at once at its fsync (table_writeback.py). Started after
        # the WAL's watch, which the store cannot do without, while this one can.
        self._writeback = TableWriteback(self.path)
        self._writeback.start()
        self.sync = sync
        if new_store and wal_prewarm_bytes > 0:
            self._prewarm_wal(wal_prewarm_bytes)

    def _prewarm_wal(self, size: int) -> None:
        """Leave a recycled WAL file of about `size` bytes for the first appends to overwrite.

        A new store's WAL grows with every append, and an fdatasync of a growing file must
        also commit its size and extents to the filesystem journal: raw synced 200-byte
        writes here took p50 0.31-0.33 / p99 0.80-1.56 ms on a new store against 0.22-0.23 /
        0.51-0.83 ms on a pre-warmed one (20,000 writes each, 2026-11-22). Filler written
        outside every key prefix the log uses, flushed and dropped, turns the first WAL
        into a recycled one (set_recycle_log_file_num) without leaving data behind; it
        costs ~0.3 s once, on the first start of a node. Restarts keep recycling the WALs
        they recover, so they need none of this.
        """
        chunk = b"\0" * (1 << 20)
        count = max(1, size >> 20)
        for i in range(count):
            wb = WriteBatch(raw_mode=True)
            wb.put(_PREWARM_PREFIX + _U64.pack(i), chunk)
            self._db.write(wb, _UNSYNCED)
        # One sync of the whole file: left to background writeback, its dirty pages slowed
        # the first appends' fsyncs for half a minute.
        self.wal.sync()
        self._db.flush()
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(_PREWARM_PREFIX, _PREWARM_PREFIX + _MAX_KEY)
        self._db.write(wb)
        self._db.flush()  # the filler's WAL is obsolete now, and recycled
        self._db.compact_range(_PREWARM_PREFIX, _PREWARM_PREFIX + _MAX_KEY)

    def close(self) -> None:
        self._db.close()
        self.wal.close()
        self._writeback.close()

    # -- meta --------------------------------------------------------------------------

    def channel_names(self) -> list[str]:
        names = []
        it = self._db.iter(ReadOptions())
        it.seek(b"m")
        while it.valid():
            key = it.key()
            if not key.startswith(b"m"):
                break
            names.append(key[1:].decode())
            it.next()
        _finish(it)
        return names

    def _get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)
        except Exception as exc:
            raise read_error(exc) from None

    def load_meta(self, name: str) -> ChannelMeta | None:
        raw = self._get(_meta_key(name))
        return None if raw is None else ChannelMeta.from_bytes(raw)

    @staticmethod
    def put_meta(wb: WriteBatch, name: str, meta: ChannelMeta) -> None:
        wb.put(_meta_key(name), meta.to_bytes())

    def load_commit(self, name: str) -> int | None:
        raw = self._get(_commit_key(name))
        return None if raw is None else _U64.unpack(raw)[0]

    @staticmethod
    def put_commit(wb: WriteBatch, name: str, offset: int) -> None:
        wb.put(_commit_key(name), _U64.pack(offset))

    def tail(self, name: str) -> Tail:
        prefix = log_prefix(name)
        it = self._db.iter(ReadOptions())
        it.seek_for_prev(prefix + _MAX_KEY)
        if not it.valid() or not it.key().startswith(prefix):
            _finish(it)
            return Tail(0, 0, 0, 0)
        base = _U64.unpack(it.key()[len(prefix) :])[0]
        value = it.value()
        last_term, first_tick, count = records.peek(value)
        last_tick = first_tick + records.ticks_used(records.peek_flags(value), count) - 1
        it.seek(prefix)
        if not it.valid():
            _finish(it)
        first = _U64.unpack(it.key()[len(prefix) :])[0]
        raw = self._get(_size_key(name))
        size = _U64.unpack(raw)[0] if raw else 0
        return Tail(first, base + count, last_tick, size, last_term)

    # -- records -----------------------------------------------------------------------

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    @staticmethod
    def put_record(wb: WriteBatch, name: str, base: int, value: bytes) -> None:
        wb.put(log_key(name, base), value)
        if records.peek_flags(value) & records.FLAG_CURSORS:
            wb.put(_cursors_key(name), _U64.pack(base) + value)

    def load_cursors(self, name: str) -> tuple[int, bytes] | None:
        """(base offset, record) of the pchannel's newest cursor record, if any."""
        raw = self._get(_cursors_key(name))
        return None if raw is None else (_U64.unpack_from(raw)[0], raw[_U64.size :])

    def _cursors_before(self, name: str, offset: int) -> tuple[int, bytes] | None:
        """The newest cursor record below `offset`, walking back (only after a cut)."""
        prefix = log_prefix(name)
        it = self._db.iter(ReadOptions())
        it.seek_for_prev(prefix + _U64.pack(offset))
        while it.valid() and it.key().startswith(prefix):
            base = _U64.unpack(it.key()[len(prefix) :])[0]
            value = it.value()
            if base < offset and records.peek_flags(value) & records.FLAG_CURSORS:
                return base, value
            it.prev()
        _finish(it)
        return None

    def load_producer(self, name: str, producer_id: str) -> bytes | None:
        return self._get(_producer_key(name, producer_id))

    @staticmethod
    def put_producer(wb: WriteBatch, name: str, producer_id: str, raw: bytes) -> None:
        wb.put(_producer_key(name, producer_id), raw)

    @staticmethod
    def drop_producer(wb: WriteBatch, name: str, producer_id: str) -> None:
        wb.delete(_producer_key(name, producer_id))

    def producer_windows(self, name: str) -> Iterator[tuple[str, bytes]]:
        """(producer id, persisted window) of every idempotent producer of `name`."""
        prefix = _producer_key(name, "")
        it = self._db.iter(ReadOptions())
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield it.key()[len(prefix) :].decode(), it.value()
            it.next()
        _finish(it)

    @staticmethod
    def put_size(wb: WriteBatch, name: str, size: int) -> None:
        wb.put(_size_key(name), _U64.pack(size))

    def write(self, wb: WriteBatch) -> None:
        """Synced or not, as the store's durability says."""
        if self.sync:
            self.write_synced(wb)
        else:
            self._write(wb)

    def _write(self, wb: WriteBatch) -> None:
        """A write RocksDB refuses (no space, a read-only or failing disk) is a
        StreamingError for the caller to answer with, never an unexpected exception."""
        try:
            self._db.write(wb, _UNSYNCED)
        except Exception as exc:
            raise StoreUnwritable(f"storage write failed: {exc}") from None

    def records_from(
        self, name: str, offset: int, limit: int, max_bytes: int = 1 << 62
    ) -> list[tuple[int, bytes]]:
        """Up to `limit` (base offset, value) pairs (or about `max_bytes`), starting with the
        record holding `offset`."""
        prefix = log_prefix(name)
        it = self._db.iter(ReadOptions())
        it.seek_for_prev(prefix + _U64.pack(offset))
        if not (it.valid() and it.key().startswith(prefix)):
            it.seek(prefix)
        out: list[tuple[int, bytes]] = []
        plen = len(prefix)
        size = 0
        while it.valid() and len(out) < limit and size < max_bytes:
            key = it.key()
            if not key.startswith(prefix):
                break
            value = it.value()
            base = _U64.unpack(key[plen:])[0]
            if base + records.peek(value)[2] > offset:
                out.append((base, value))
                size += len(value)
            it.next()
        _finish(it)
        return out

    def verify(
        self, name: str, start: int, end: int, term_starts: frozenset[int], max_bytes: int
    ) -> VerifyStep:
        """Read `name`'s records from the one holding `start` towards `end`, about
        `max_bytes` of them, each through RocksDB's block checksums and the record's own
        CRC, bypassing the block cache (a cached block is no proof of the bytes on disk).

        Offsets must be dense: a missing record is a loss too, except where a term starts
        above the previous end (an unclean move or an accepted loss skips offsets there).
        Returns where the next step starts, or the first offset that failed and why.
        """
        opts = ReadOptions()
        opts.set_verify_checksums(True)
        opts.fill_cache(False)
        opts.set_readahead_size(2 * 1024 * 1024)
        prefix = log_prefix(name)
        plen = len(prefix)
        it = self._db.iter(opts)
        position = start
        read = 0
        try:
            it.seek_for_prev(prefix + _U64.pack(start))
            if not (it.valid() and it.key().startswith(prefix)):
                it.seek(prefix)
            while it.valid() and read < max_bytes:
                key = it.key()
                if not key.startswith(prefix):
                    break
                base = _U64.unpack(key[plen:])[0]
                if base >= end:
                    return VerifyStep(end)
                value = it.value()
                if base > position and base not in term_starts:
                    return VerifyStep(position, f"offsets {position}..{base - 1} are missing")
                try:
                    rec = records.decode(value, f"{name}@{base}")
                except records.CorruptRecord as err:
                    return VerifyStep(max(base, position), err.cause)
                position = max(position, base + rec.count)
                read += len(value)
                it.next()
            it.status()
        except Exception as exc:
            err = read_error(exc)
            return VerifyStep(position, err.cause, isinstance(err, StoreCorruption))
        if read < max_bytes and position < end:
            return VerifyStep(position, f"the log ends at offset {position}, below {end}")
        return VerifyStep(position)

    def iter_headers(self, name: str) -> Iterator[tuple[int, int, int, int]]:
        """(base, first tick, count, value size) from the oldest record on: for retention."""
        prefix = log_prefix(name)
        it = self._db.iter(ReadOptions())
        it.seek(prefix)
        plen = len(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            value = it.value()
            _, first_tick, count = records.peek(value)
            yield _U64.unpack(key[plen:])[0], first_tick, count, len(value)
            it.next()
        _finish(it)

    def _bytes_from(self, name: str, offset: int) -> int:
        """Record bytes at or after `offset`, counted up to the first unreadable record
        (a damaged suffix is cut too; the size counter then overstates a little)."""
        prefix = log_prefix(name)
        it = self._db.iter(ReadOptions())
        it.seek(log_key(name, offset))
        total = 0
        while it.valid() and it.key().startswith(prefix):
            total += len(it.value())
            it.next()
        return total

    def truncate_from(self, name: str, offset: int, keep_window: Callable[[bytes], bytes]) -> int:
        """Drop every record at or after `offset`; each producer window (which may name
        them) becomes `keep_window(window)`, deleted when empty. Returns the bytes dropped.
        Synchronous and durable."""
        dropped = self._bytes_from(name, offset)
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(log_key(name, offset), log_prefix(name) + _MAX_KEY + b"\xff")
        for producer_id, window in self.producer_windows(name):
            kept = keep_window(window)
            if kept:
                self.put_producer(wb, name, producer_id, kept)
            else:
                self.drop_producer(wb, name, producer_id)
        raw = self._get(_size_key(name))
        size = _U64.unpack(raw)[0] if raw else 0
        wb.put(_size_key(name), _U64.pack(max(0, size - dropped)))
        cursors = self.load_cursors(name)
        if cursors is not None and cursors[0] >= offset:  # the cut took the newest snapshot
            older = self._cursors_before(name, offset)
            if older is None:
                wb.delete(_cursors_key(name))
            else:
                wb.put(_cursors_key(name), _U64.pack(older[0]) + older[1])
        self.write_synced(wb)
        return dropped

    def sync_wal(self) -> None:
        """Make every write so far durable (async durability's periodic sync)."""
        try:
            self.wal.sync()
        except OSError as exc:
            raise StoreUnwritable(f"storage sync failed: {exc}") from None

    def write_synced(self, wb: WriteBatch) -> None:
        """Durable on return, whatever the store's durability (fences, term history,
        copied logs)."""
        self.write_synced_many([wb])

    def write_synced_many(self, wbs: list[WriteBatch]) -> None:
        """Every batch durable with one sync of the WAL (node/synced_writer.py). A failure
        fails them all: the callers go back to what the store holds."""
        for wb in wbs:
            self._write(wb)
        self.sync_wal()
