"""The local meta store's files: a journal of keyed puts, one append and one sync a batch.

A directory holds

    DIR/CURRENT        b"SWC1" | generation (u64 BE) | crc32 (u32 BE): which journal is live
    DIR/journal.GEN    the live journal: a header, a snapshot, then appended frames

A journal starts with ``b"SWJ1" | generation (u64) | snapshot length (u64) | crc32 (u32)``;
the snapshot (every live entry when the journal was started) and every later batch are
*frames*: ``b"SWJF" | body length (u32) | crc32 of the body (u32) | body``, a body being
entries ``length (u32) | space (u8) | deleted (u8) | version (u64) | key length (u16) |
key | payload``. The last entry of a key wins; a delete drops it.

Why a journal: the coord writes a record per pchannel and step, 1,024 at once when a node
is lost. One file per record made each such batch 1,024 temporary files, a syncfs, 1,024
renames and a folder fsync (0.5-1.7 s here); a batch is now one `write` and one
`fdatasync` of its frame (issue 24, docs/decisions-scale.md).

Crash safety. A batch returns only after its frame is synced, so a kill -9 can tear only
the frame being appended: on open a last frame that is incomplete or fails its checksum
is cut (logged). A bad frame that is followed by a good one, or one inside the snapshot
(synced before the journal became live), is damage, not a crash: the store refuses to
open (CorruptRecord). A damaged frame header far from the end (farther than one frame
can reach) is damage too.

Compaction. When the journal outgrows its live entries by `COMPACT_FACTOR` and
`COMPACT_SLACK`, generation GEN+1 is written next to it (temporary file, fsync, rename,
folder fsync) with the live entries as its snapshot, CURRENT is switched the same way,
and the old journal is removed. A crash between those steps leaves either the old
generation (CURRENT still names it) or a complete new one that CURRENT does not name yet
(adopted on open); leftovers of older generations are removed.

A file that vanishes must never silently drop pchannels: if CURRENT names a journal that
is gone, the store refuses to open (MissingRecords) unless told to forget what it held.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streamwal.files import fsync_dir

log = logging.getLogger("streamwal.coord.meta_store")

CURRENT = "CURRENT"
_JOURNAL = re.compile(r"^journal\.([0-9]{1,19})$")

_CURRENT = struct.Struct(">4sQI")
_CURRENT_MAGIC = b"SWC1"
_HEADER = struct.Struct(">4sQQI")
_HEADER_MAGIC = b"SWJ1"
_FRAME = struct.Struct(">4sII")
_FRAME_MAGIC = b"SWJF"
_ENTRY = struct.Struct(">IBBQH")  # length of the rest, space, deleted, version, key length

MAX_ENTRY = 16 << 20  # one record (a broadcast task carries a message of up to 4 MiB)
MAX_FRAME = 64 << 20  # one batch: a batch is cut before it grows past this
MAX_JOURNAL = 1 << 30  # the file; appends that would pass it are refused
COMPACT_FACTOR = 2  # compact once the journal is this many times its live entries ...
COMPACT_SLACK = 1 << 20  # ... plus this much


class JournalError(Exception):
    """Base of what the journal refuses; the store maps each to its own error."""


class Corrupt(JournalError):
    """A file is damaged: the journal refuses to guess."""


class Missing(JournalError):
    """The journal CURRENT names is gone."""


class Unwritable(JournalError):
    """An append or a compaction failed; the journal is as it was before it."""


class TooLarge(JournalError):
    """An entry over MAX_ENTRY, or a journal that would pass MAX_JOURNAL."""


Key = tuple[int, str]  # (space, key)


@dataclass(frozen=True)
class Entry:
    """One keyed put (`payload`) or delete (None) at `version`."""

    space: int
    key: str
    version: int
    payload: bytes | None

    def encode(self) -> bytes:
        key = self.key.encode()
        payload = self.payload or b""
        size = _ENTRY.size - 4 + len(key) + len(payload)
        if size > MAX_ENTRY:
            raise TooLarge(f"a record of {size} bytes is over the limit of {MAX_ENTRY} bytes")
        head = _ENTRY.pack(size, self.space, self.payload is None, self.version, len(key))
        return head + key + payload


def _decode_entries(body: bytes, where: str) -> list[Entry]:
    out = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < _ENTRY.size:
            raise Corrupt(f"{where}: an entry is cut short")
        size, space, deleted, version, key_len = _ENTRY.unpack_from(body, pos)
        end = pos + 4 + size
        key_end = pos + _ENTRY.size + key_len
        if end > len(body) or key_end > end:
            raise Corrupt(f"{where}: an entry runs past its frame")
        key = body[pos + _ENTRY.size : key_end].decode()
        out.append(Entry(space, key, version, None if deleted else body[key_end:end]))
        pos = end
    return out


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(_FRAME_MAGIC, len(body), zlib.crc32(body)) + body


def _frame_at(data: bytes, pos: int) -> tuple[bytes | None, int | None]:
    """The body of the frame at `pos` (None if it is not whole and valid) and where the
    next frame starts if the header can tell (None if it cannot)."""
    if len(data) - pos < _FRAME.size:
        return None, None
    magic, size, crc = _FRAME.unpack_from(data, pos)
    if magic != _FRAME_MAGIC or size > MAX_FRAME:
        return None, None
    end = pos + _FRAME.size + size
    if end > len(data):
        return None, end
    body = data[pos + _FRAME.size : end]
    return (body if zlib.crc32(body) == crc else None), end


def _write_atomically(path: Path, parts: Iterable[bytes]) -> None:
    """Temporary file, fsync, rename over `path`, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for part in parts:
                _write_fully(fd, part)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Journal:
    """The live generation of a directory: replayed on open, appended to in batches.

    Not thread-safe: the store calls `append` from one flush at a time (its thread)."""

    def __init__(self, directory: Path, generation: int, fd: int, size: int) -> None:
        self.dir = directory
        self.generation = generation
        self._fd = fd
        self.size = size
        self.live: dict[Key, bytes] = {}  # encoded entries, what a snapshot writes
        self.live_bytes = 0
        self.compactions = 0

    # ------------------------------------------------------------------ opening

    @classmethod
    def generations(cls, directory: Path) -> dict[int, Path]:
        return {int(m.group(1)): p for p in directory.iterdir() if (m := _JOURNAL.match(p.name))}

    @classmethod
    def open(cls, directory: Path, forget_missing: bool) -> Journal:
        """The live generation with its entries replayed (a new, empty one in a fresh
        directory); see the module docstring for what is repaired and what refused."""
        for stale in directory.glob(".*.tmp"):
            stale.unlink()
        found = cls.generations(directory)
        current = _read_current(directory)
        if current is None:
            if not found:
                return cls.start(directory, {}, 1)
            # A journal is renamed into place before CURRENT names it: one that CURRENT
            # does not name yet is whole (the first start, or a migration, crashed there).
            generation = max(found)
            log.warning("meta store without CURRENT: adopting %s", found[generation].name)
        elif current + 1 in found:
            generation = current + 1  # a compaction crashed before switching CURRENT
        elif current in found:
            generation = current
        elif not forget_missing:
            raise Missing(f"journal.{current}")
        else:
            older = [g for g in found if g < current]
            log.error(
                "meta store journal gone: its pchannel records are forgotten for good",
                extra={"journal": f"journal.{current}"},
            )
            if not older:
                return cls.start(directory, {}, current + 1)
            generation = max(older)
        newer = [g for g in found if g > generation]
        if newer:
            raise Corrupt(f"journal.{max(newer)} is newer than the live journal.{generation}")
        journal = cls._replay(directory, generation)
        if current != journal.generation:
            _write_current(directory, journal.generation)
        for older_gen in (g for g in found if g < generation):
            found[older_gen].unlink()
        if len(found) > 1:
            fsync_dir(directory)
        return journal

    @classmethod
    def start(cls, directory: Path, live: dict[Key, bytes], generation: int) -> Journal:
        """A new generation holding `live` (encoded entries) as its snapshot, made live."""
        path = directory / f"journal.{generation}"
        frames = [_frame(b"".join(chunk)) for chunk in _chunks(list(live.values()))]
        base = sum(len(f) for f in frames)
        head = _HEADER.pack(_HEADER_MAGIC, generation, base, 0)
        head = head[:-4] + struct.pack(">I", zlib.crc32(head[:-4]))
        _write_atomically(path, [head, *frames])
        _write_current(directory, generation)
        fd = os.open(path, os.O_WRONLY)
        size = os.lseek(fd, 0, os.SEEK_END)
        journal = cls(directory, generation, fd, size)
        journal.live = dict(live)
        journal.live_bytes = sum(len(e) for e in live.values())
        return journal

    @classmethod
    def _replay(cls, directory: Path, generation: int) -> Journal:
        path = directory / f"journal.{generation}"
        size = path.stat().st_size
        if size > MAX_JOURNAL + MAX_FRAME:
            raise Corrupt(f"{path}: {size} bytes, over the limit of {MAX_JOURNAL}")
        data = path.read_bytes()
        if len(data) < _HEADER.size:
            raise Corrupt(f"{path}: truncated header")
        magic, gen, base, crc = _HEADER.unpack_from(data)
        if magic != _HEADER_MAGIC or zlib.crc32(data[: _HEADER.size - 4]) != crc:
            raise Corrupt(f"{path}: bad magic or checksum in its header")
        if gen != generation:
            raise Corrupt(f"{path}: holds generation {gen}, not {generation}")
        base_end = _HEADER.size + base
        if len(data) < base_end:  # cut at a frame's end inside it: no torn frame says so
            raise Corrupt(f"{path}: its snapshot is cut short ({len(data)} of {base_end} bytes)")
        fd = os.open(path, os.O_WRONLY)
        journal = cls(directory, generation, fd, len(data))
        try:
            pos = _HEADER.size
            while pos < len(data):
                body, end = _frame_at(data, pos)
                if body is None:
                    journal._cut(data, pos, end, base_end)
                    break
                for entry in _decode_entries(body, f"{path} at byte {pos}"):
                    journal._apply(entry, entry.encode())
                pos = end or len(data)
        except BaseException:
            os.close(fd)
            raise
        return journal

    def _cut(self, data: bytes, pos: int, end: int | None, base_end: int) -> None:
        """A bad frame at `pos`: cut it if it is the torn tail of a crash, refuse if not."""
        path = self.dir / f"journal.{self.generation}"
        if pos < base_end:
            raise Corrupt(f"{path}: damaged snapshot at byte {pos}")
        if len(data) - pos > _FRAME.size + MAX_FRAME:
            raise Corrupt(f"{path}: damaged frame at byte {pos}, farther from the end than a batch")
        if end is not None and end < len(data) and _frame_at(data, end)[0] is not None:
            raise Corrupt(f"{path}: damaged frame at byte {pos}, before a good one")
        log.warning(
            "meta store journal: a torn last batch is cut (a crash while it was written)",
            extra={"journal": path.name, "at_byte": pos, "bytes_cut": len(data) - pos},
        )
        os.ftruncate(self._fd, pos)
        os.fsync(self._fd)
        self.size = pos

    # ------------------------------------------------------------------ writing

    def _apply(self, entry: Entry, encoded: bytes) -> None:
        key = (entry.space, entry.key)
        old = self.live.pop(key, None)
        if old is not None:
            self.live_bytes -= len(old)
        if entry.payload is not None:
            self.live[key] = encoded
            self.live_bytes += len(encoded)

    def entries(self) -> list[Entry]:
        """Every live entry (put, not deleted), in key order."""
        return [_decode_entries(self.live[key], "memory")[0] for key in sorted(self.live)]

    def append(self, entries: list[tuple[Entry, bytes]]) -> None:
        """Make `entries` (each with its encoding) durable with one write and one
        fdatasync (one frame: the caller keeps a batch under MAX_FRAME), then compact if
        the journal grew past its bound. Unwritable if the append failed (the file is cut
        back: nothing changed)."""
        frame = _frame(b"".join(data for _, data in entries))
        if len(frame) > _FRAME.size + MAX_FRAME:
            raise TooLarge(f"a batch of {len(frame)} bytes is over {MAX_FRAME}")
        if self.size + len(frame) > MAX_JOURNAL:
            raise TooLarge(
                f"the journal would pass {MAX_JOURNAL} bytes: its live records "
                f"({self.live_bytes} bytes) leave no room to compact"
            )
        if self._fd < 0:
            raise Unwritable("the journal is closed after a failed write; restart the coord")
        try:
            os.lseek(self._fd, self.size, os.SEEK_SET)
            _write_fully(self._fd, frame)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._undo()
            raise Unwritable(exc.strerror or str(exc)) from None
        self.size += len(frame)
        for entry, data in entries:
            self._apply(entry, data)
        if self.size > COMPACT_FACTOR * self.live_bytes + COMPACT_SLACK:
            self.compact()

    def _undo(self) -> None:
        """Cut a failed append back off; if even that fails, stop writing (a frame that
        is half there must not be followed by more, or replay would refuse the file)."""
        try:
            os.ftruncate(self._fd, self.size)
            os.fdatasync(self._fd)
        except OSError:
            os.close(self._fd)
            self._fd = -1

    def compact(self) -> None:
        """A new generation with the live entries as its snapshot; the old one removed.
        A failure before CURRENT names the new one keeps the old (logged, retried at the
        next append past the bound)."""
        old = self.dir / f"journal.{self.generation}"
        try:
            new = Journal.start(self.dir, self.live, self.generation + 1)
        except (OSError, Corrupt) as exc:
            try:
                switched = _read_current(self.dir) == self.generation + 1
            except (OSError, Corrupt):
                switched = True  # unknown: stop writing rather than guess
            log.error(
                "meta store compaction failed"
                + ("; no more writes until a restart" if switched else "; the journal grows"),
                extra={"error": str(exc), "bytes": self.size},
            )
            if switched:
                self.close()  # the batch that got here is durable; later ones are refused
            else:
                (self.dir / f"journal.{self.generation + 1}").unlink(missing_ok=True)
            return
        os.close(self._fd)
        self._fd, self.generation, self.size = new._fd, new.generation, new.size
        self.compactions += 1
        old.unlink(missing_ok=True)
        fsync_dir(self.dir)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _chunks(entries: list[bytes]) -> Iterable[list[bytes]]:
    """Snapshot frames of at most MAX_FRAME bytes each."""
    chunk: list[bytes] = []
    size = 0
    for encoded in entries:
        if chunk and size + len(encoded) > MAX_FRAME:
            yield chunk
            chunk, size = [], 0
        chunk.append(encoded)
        size += len(encoded)
    if chunk:
        yield chunk


def _read_current(directory: Path) -> int | None:
    path = directory / CURRENT
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _CURRENT.size:
        raise Corrupt(f"{path}: {len(data)} bytes, not {_CURRENT.size}")
    magic, generation, crc = _CURRENT.unpack(data)
    if magic != _CURRENT_MAGIC or zlib.crc32(data[:-4]) != crc:
        raise Corrupt(f"{path}: bad magic or checksum")
    return generation


def _write_current(directory: Path, generation: int) -> None:
    head = _CURRENT.pack(_CURRENT_MAGIC, generation, 0)[:-4]
    _write_atomically(directory / CURRENT, [head + struct.pack(">I", zlib.crc32(head))])
