"""lazyfs's model of what a power loss keeps (fast, no FUSE), and the real mount under
RocksDB: what was synced survives, what was not is gone. The nemesis suite trusts these."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nemesis.lazyfs import PAGE, ROOT, FsError, LazyState

FILE = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755


@pytest.fixture
def fs(tmp_path: Path):
    state = LazyState(tmp_path / "backing")
    yield state
    state.close()


def names(fs: LazyState, directory: int = ROOT) -> list[bytes]:
    return sorted(fs.inodes[directory].entries)


def content(fs: LazyState, name: bytes, directory: int = ROOT) -> bytes:
    return fs.read(fs.lookup(directory, name).ino, 0, 1 << 20)


def new_file(fs: LazyState, name: bytes, data: bytes = b"", synced: bool = True) -> int:
    ino = fs.create(ROOT, name, FILE).ino
    fs.write(ino, 0, data)
    if synced:
        fs.sync_file(ino)
        fs.sync_dir(ROOT)
    return ino


def test_unsynced_data_and_size_are_lost_synced_kept(fs) -> None:
    ino = new_file(fs, b"wal", b"a" * 5000)
    fs.write(ino, 5000, b"b" * 100)  # an append past the synced size
    fs.write(ino, 10, b"X")  # an overwrite inside it
    assert content(fs, b"wal")[:12] == b"aaaaaaaaaaXa"
    report = fs.power_loss()
    assert content(fs, b"wal") == b"a" * 5000
    assert report["files"] == {"/wal": 2 * PAGE}


def test_fdatasync_keeps_everything_written_before_it(fs) -> None:
    ino = new_file(fs, b"wal", b"")
    for i in range(10):
        fs.write(ino, i * 1000, bytes([65 + i]) * 1000)
    fs.sync_file(ino)
    fs.write(ino, 10_000, b"lost")
    fs.power_loss()
    data = content(fs, b"wal")
    assert len(data) == 10_000 and data[-1000:] == b"J" * 1000


@pytest.mark.parametrize("sync_file", [True, False])
def test_a_created_file_needs_its_directory_synced(fs, sync_file: bool) -> None:
    ino = fs.create(ROOT, b"000009.sst", FILE).ino
    fs.write(ino, 0, b"table")
    if sync_file:
        fs.sync_file(ino)
    fs.power_loss()
    assert names(fs) == []
    assert not list(fs.backing.iterdir()), "the dropped file's backing is gone too"


def test_a_synced_directory_keeps_an_unsynced_file_empty(fs) -> None:
    ino = fs.create(ROOT, b"CURRENT", FILE).ino
    fs.write(ino, 0, b"MANIFEST-000005\n")
    fs.sync_dir(ROOT)
    fs.power_loss()
    assert names(fs) == [b"CURRENT"] and content(fs, b"CURRENT") == b""


def test_an_unsynced_rename_is_undone_both_names_back(fs) -> None:
    new_file(fs, b"CURRENT", b"MANIFEST-1\n")
    new_file(fs, b"000002.dbtmp", b"MANIFEST-2\n")
    fs.rename(ROOT, b"000002.dbtmp", ROOT, b"CURRENT")
    assert names(fs) == [b"CURRENT"] and content(fs, b"CURRENT") == b"MANIFEST-2\n"
    fs.power_loss()
    assert names(fs) == [b"000002.dbtmp", b"CURRENT"]
    assert content(fs, b"CURRENT") == b"MANIFEST-1\n"


def test_a_rename_followed_by_a_directory_sync_stays(fs) -> None:
    new_file(fs, b"CURRENT", b"MANIFEST-1\n")
    new_file(fs, b"000002.dbtmp", b"MANIFEST-2\n")
    fs.rename(ROOT, b"000002.dbtmp", ROOT, b"CURRENT")
    fs.sync_dir(ROOT)
    fs.power_loss()
    assert names(fs) == [b"CURRENT"] and content(fs, b"CURRENT") == b"MANIFEST-2\n"


def test_an_unsynced_unlink_brings_the_file_back(fs) -> None:
    new_file(fs, b"000004.log", b"records")
    fs.unlink(ROOT, b"000004.log")
    fs.collect([])  # nothing may free what a power loss brings back
    fs.power_loss()
    assert content(fs, b"000004.log") == b"records"


def test_a_synced_unlink_frees_the_file(fs) -> None:
    new_file(fs, b"000004.log", b"records")
    fs.unlink(ROOT, b"000004.log")
    fs.sync_dir(ROOT)
    fs.collect([])
    assert not list(fs.backing.iterdir())


def test_an_open_unlinked_file_lives_until_closed(fs) -> None:
    ino = new_file(fs, b"tmp", b"data")
    fs.unlink(ROOT, b"tmp")
    fs.sync_dir(ROOT)
    fs.collect([ino])  # still open
    assert fs.read(ino, 0, 10) == b"data"
    fs.collect([])
    with pytest.raises(FsError):
        fs.read(ino, 0, 10)


def test_a_truncation_reads_zeros_when_extended_and_is_lost_unsynced(fs) -> None:
    ino = new_file(fs, b"f", b"x" * 10_000)
    fs.truncate(ino, 100)
    fs.write(ino, 8000, b"y")
    data = content(fs, b"f")
    assert data[:100] == b"x" * 100 and data[100:8000] == bytes(7900) and data[8000:] == b"y"
    fs.power_loss()
    assert content(fs, b"f") == b"x" * 10_000
    fs.truncate(ino, 100)
    fs.write(ino, 8000, b"y")
    fs.sync_file(ino)
    fs.power_loss()
    assert content(fs, b"f") == b"x" * 100 + bytes(7900) + b"y"


def test_keep_writes_unsynced_pages_inside_the_synced_size_only(fs) -> None:
    ino = new_file(fs, b"log", b"o" * (3 * PAGE))
    fs.write(ino, 0, b"n" * (4 * PAGE))  # an overwrite of 3 pages and an append of 1
    fs.power_loss(keep=1.0)
    assert content(fs, b"log") == b"n" * (3 * PAGE)


def test_a_new_directory_needs_its_parent_synced(fs) -> None:
    sub = fs.create(ROOT, b"db", DIR).ino
    ino = fs.create(sub, b"CURRENT", FILE).ino
    fs.write(ino, 0, b"x")
    fs.sync_file(ino)
    fs.sync_dir(sub)
    fs.power_loss()
    assert names(fs) == []  # RocksDB does not sync the parent of a directory it creates


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rocksdb_on_the_mount_keeps_synced_writes_only(nemesis) -> None:
    mount = nemesis.lazy_mount(nemesis.root / "db")
    script = """
import os, sys
from rocksdict import Options, Rdict, WriteOptions
db = Rdict(sys.argv[1], Options(raw_mode=True))
synced, unsynced = WriteOptions(), WriteOptions()
synced.sync = True
for i in range(500):
    db.put(b"s%03d" % i, b"v" * 100, synced)
for i in range(500):
    db.put(b"u%03d" % i, b"v" * 100, unsynced)
os._exit(0)  # no close: as kill -9
"""
    subprocess.run([sys.executable, "-c", script, str(mount.mountpoint)], check=True, timeout=60)
    dropped = mount.power_loss()
    assert any(path.endswith(".log") for path in dropped["files"]), dropped
    from rocksdict import Options, Rdict

    db = Rdict(str(mount.mountpoint), Options(raw_mode=True))
    try:
        keys = list(db.keys())
    finally:
        db.close()
    assert sorted(keys) == [b"s%03d" % i for i in range(500)]
    assert os.path.ismount(mount.mountpoint)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_stores_synced_writes_survive_a_power_loss_across_wal_switches(nemesis) -> None:
    """The node's store syncs its WAL itself (node/wal_files.py): the WAL files created
    and recycled by memtable switches, and their names, must be synced as RocksDB's own
    synced writes did. (RocksDB syncs the closed WALs when it flushes: the writes after
    the last switch are the ones only the store's syncs keep.)"""
    mount = nemesis.lazy_mount(nemesis.root / "store")
    script = """
import os, sys
from streamwal.node.log_store import LogStore
store = LogStore(sys.argv[1])
for i in range(400):
    wb = store.new_batch()
    wb.put(b"s%04d" % i, b"v" * 100)
    store.write_synced(wb)
    if i in (99, 199, 299):
        store._db.flush()  # a memtable switch: a new WAL file (the first two), then a
        # recycled one (renamed); only the store's own syncs cover the writes after each
for i in range(100):
    wb = store.new_batch()
    wb.put(b"u%04d" % i, b"v" * 100)
    store._write(wb)  # never synced
os._exit(0)  # no close: as kill -9
"""
    subprocess.run([sys.executable, "-c", script, str(mount.mountpoint)], check=True, timeout=60)
    mount.power_loss()
    from streamwal.node.log_store import LogStore

    store = LogStore(mount.mountpoint)
    try:
        keys = list(store._db.keys())
    finally:
        store.close()
    synced = [b"s%04d" % i for i in range(400)]
    assert [k for k in keys if k.startswith(b"s")] == synced
    assert os.path.ismount(mount.mountpoint)
