"""Salvage: rebuild a node's store from every record that still reads back whole.

Why: RocksDB cannot drop a damaged table block in place. A range tombstone over it hides
its keys from a forward scan, but seeks that land in the block still read it, and the
first compaction that takes the file fails; with paranoid checks (which the node keeps
on, so corruption is never ignored) that stops every write of the node. So a node that
finds a table block failing its checksum only marks the store (`MARKER`, with the reason)
and stops serving what it cannot read; the next start-up (or `streamwal node salvage`)
copies every readable key into a fresh store, keeps the damaged one aside for forensics,
and swaps them. What could not be read is then simply absent: the acknowledged-offset
ledger (which moves with the store) and the verification of each log find it as a
shorter log or a gap, and the pchannel is rebuilt from a replica or its loss accepted.

Runs with the node stopped: nothing else may have the store open.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from streamwal.files import fsync_dir
from streamwal.node.ack_ledger import FILE_NAME as LEDGER_FILE

log = logging.getLogger("streamwal.node.salvage")

MARKER = "SALVAGE-NEEDED"
_U64 = struct.Struct(">Q")
_COPY_BYTES = 8 * 1024 * 1024  # one write of the new store


@dataclass
class SalvageReport:
    keys: int = 0
    bytes: int = 0
    # [first key skipped after, first key read again] of every damaged stretch (hex)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kept_at: str = ""


def mark_needed(data_dir: str | Path, reason: str) -> None:
    """Ask the next start-up to salvage the store (idempotent, durable)."""
    path = Path(data_dir) / MARKER
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(reason + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def needed(data_dir: str | Path) -> str:
    """The reason recorded by `mark_needed`, or "" when no salvage is pending."""
    try:
        return (Path(data_dir) / MARKER).read_text().strip()
    except FileNotFoundError:
        return ""


def repair(data_dir: str | Path, error: str) -> None:
    """A store RocksDB refuses to open as corrupt (a table file truncated or gone, a
    damaged MANIFEST): RocksDB's own repair rebuilds the MANIFEST from the files it can
    read and moves the others to `<data_dir>/lost/`. Their records are then simply
    absent, which the acknowledged-offset ledger and the verification report as a loss
    (rebuilt from a replica, or accepted); a salvage follows, for damaged blocks inside
    the files that remain."""
    log.error(
        "the store does not open: repairing it", extra={"data_dir": str(data_dir), "error": error}
    )
    Rdict.repair(str(data_dir), Options(raw_mode=True))
    lost = (
        sorted(p.name for p in (Path(data_dir) / "lost").glob("*"))
        if (Path(data_dir) / "lost").exists()
        else []
    )
    log.warning("store repaired", extra={"data_dir": str(data_dir), "moved_to_lost": lost})
    mark_needed(data_dir, f"repaired after: {error}")


def _readable_at(db: Rdict, read: ReadOptions, target: bytes):
    """An iterator on the first key >= `target` if that key reads back whole; None if
    the seek lands on damage; False when there is no key at or after `target`."""
    it = db.iter(read)
    it.seek(target)
    if it.valid():
        return it
    try:
        it.status()
        return False
    except Exception:
        return None


def _skip_damage(db: Rdict, read: ReadOptions, last: bytes | None):
    """An iterator on the first readable key past the damage after `last` (None: there
    is none). Past a log key the offset grows by doubling steps until a seek reads
    again, then bisects back, so no readable record beyond the damage is skipped."""
    last = last or b""
    if last.startswith(b"l") and len(last) > 9 and last[-9] == 0:
        prefix, (offset,) = last[:-8], _U64.unpack(last[-8:])
        bad, step = offset, 1
        while offset + step < 1 << 63:
            found = _readable_at(db, read, prefix + _U64.pack(offset + step))
            if found is False:
                break
            if found is not None:
                good = offset + step
                while good - bad > 1:
                    mid = (good + bad) // 2
                    probe = _readable_at(db, read, prefix + _U64.pack(mid))
                    if probe is None:
                        bad = mid
                    else:
                        good, found = mid, probe
                return found
            bad, step = offset + step, step * 2
        last = prefix + b"\xff" * 9  # past this pchannel's log
    for target in (last + b"\x00", last[:1] + b"\xff"):
        found = _readable_at(db, read, target)
        if found:
            return found
    return None


def salvage(data_dir: str | Path) -> SalvageReport:
    """Copy every readable key of the store at `data_dir` into a new one and swap them;
    the damaged store is kept beside it as `<data_dir>.damaged-<unix time>`."""
    data_dir = Path(data_dir)
    new_dir = data_dir.with_name(data_dir.name + ".salvaging")
    shutil.rmtree(new_dir, ignore_errors=True)
    report = SalvageReport()
    reason = needed(data_dir)
    log.warning("salvaging the store", extra={"data_dir": str(data_dir), "reason": reason})
    old = Rdict(str(data_dir), Options(raw_mode=True), access_type=AccessType.read_only())
    new_opts = Options(raw_mode=True)
    new_opts.create_if_missing(True)
    new = Rdict(str(new_dir), new_opts)
    synced = WriteOptions()
    synced.sync = True
    try:
        read = ReadOptions()
        read.set_verify_checksums(True)
        read.fill_cache(False)
        it = old.iter(read)
        it.seek_to_first()
        wb, pending = WriteBatch(raw_mode=True), 0
        last: bytes | None = None
        while True:
            while it.valid():
                key, value = it.key(), it.value()
                wb.put(key, value)
                report.keys += 1
                report.bytes += len(key) + len(value)
                pending += len(value)
                last = key
                if pending >= _COPY_BYTES:
                    new.write(wb, synced)
                    wb, pending = WriteBatch(raw_mode=True), 0
                it.next()
            try:
                it.status()
                break  # the end of the store
            except Exception as exc:
                resumed = _skip_damage(old, read, last)
                if resumed is None:
                    report.skipped.append(((last or b"").hex(), ""))
                    log.error("damaged to the end", extra={"after": (last or b"").hex()})
                    break
                it = resumed
                report.skipped.append(((last or b"").hex(), it.key().hex()))
                log.error(
                    "skipped a damaged stretch",
                    extra={"after": (last or b"").hex(), "to": it.key().hex(), "error": str(exc)},
                )
        new.write(wb, synced)
    finally:
        old.close()
        new.close()
    ledger = data_dir / LEDGER_FILE
    if ledger.exists():
        shutil.copy2(ledger, new_dir / LEDGER_FILE)
    kept = data_dir.with_name(f"{data_dir.name}.damaged-{int(time.time())}")
    os.replace(data_dir, kept)
    os.replace(new_dir, data_dir)
    fsync_dir(data_dir.parent)
    report.kept_at = str(kept)
    log.warning(
        "store salvaged",
        extra={
            "data_dir": str(data_dir),
            "keys": report.keys,
            "bytes": report.bytes,
            "damaged_stretches": len(report.skipped),
            "damaged_store_kept_at": str(kept),
        },
    )
    return report
