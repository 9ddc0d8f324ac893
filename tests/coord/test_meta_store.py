"""LocalMetaStore: compare-and-put, durability across processes and kill -9, exclusive
ownership, the journal's repairs and refusals, compaction, migration of the old format."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from streamwal.coord import meta_journal as mj
from streamwal.coord import state_machine as sm
from streamwal.coord.meta_store import (
    CorruptRecord,
    LocalMetaStore,
    MetaStoreBusy,
    MetaStoreUnwritable,
    MissingRecords,
    VersionConflict,
)
from streamwal.errors import InvalidArgument
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import coord_pb2 as cpb


def record(name: str, term: int = 0) -> cpb.ChannelRecord:
    rec = cpb.ChannelRecord(meta=sm.new_channel(name))
    rec.meta.channel.term = term
    return rec


async def test_compare_and_put(tmp_path):
    store = LocalMetaStore(tmp_path)
    first = await store.put_channel(record("ch_0"), expected=None)
    with pytest.raises(VersionConflict):
        await store.put_channel(record("ch_0"), expected=None)
    second = await store.put_channel(record("ch_0", 1), expected=first.version)
    with pytest.raises(VersionConflict):
        await store.put_channel(record("ch_0", 2), expected=first.version)
    got = await store.get_channel("ch_0")
    assert got.version == second.version and got.record.meta.channel.term == 1
    assert await store.get_channel("nope") is None
    # Mutating a returned record must not change the store.
    got.record.meta.channel.term = 99
    assert (await store.get_channel("ch_0")).record.meta.channel.term == 1
    await store.close()


async def test_reopen_sees_everything_and_rejects_bad_names(tmp_path):
    store = LocalMetaStore(tmp_path)
    for i in range(3):
        await store.put_channel(record(f"ch_{i}", i), expected=None)
    cluster_version = await store.put_cluster(cpb.ClusterRecord(incarnation=4), expected=None)
    with pytest.raises(InvalidArgument):
        await store.put_channel(record("../escape"), expected=None)
    await store.close()
    again = LocalMetaStore(tmp_path)
    assert [(s.name, s.record.meta.channel.term) for s in await again.list_channels()] == [
        ("ch_0", 0),
        ("ch_1", 1),
        ("ch_2", 2),
    ]
    cluster, version = await again.get_cluster()
    assert cluster.incarnation == 4 and version == cluster_version
    await again.close()


async def test_one_coord_per_directory(tmp_path):
    store = LocalMetaStore(tmp_path)
    with pytest.raises(MetaStoreBusy):
        LocalMetaStore(tmp_path)
    await store.close()
    LocalMetaStore(tmp_path)


def journal(directory) -> Path:
    (path,) = directory.glob("journal.*")
    return path


async def put_each(store: LocalMetaStore, names: list[str], term: int = 0) -> None:
    """One put after the other: a frame each."""
    for name in names:
        found = await store.get_channel(name)
        await store.put_channel(record(name, term), found.version if found else None)


async def test_a_bad_checksum_before_the_tail_is_reported_not_guessed(tmp_path):
    store = LocalMetaStore(tmp_path)
    await put_each(store, ["ch_0", "ch_1"])
    await store.close()
    path = journal(tmp_path)
    data = bytearray(path.read_bytes())
    first_frame_end = len(data) - (len(data) - data.index(b"SWJF")) // 2
    data[first_frame_end - 1] ^= 0xFF  # the first frame's last byte; the second is good
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord, match="before a good one"):
        LocalMetaStore(tmp_path)


async def test_a_torn_last_batch_is_cut_and_what_returned_is_kept(tmp_path, caplog):
    """A crash mid-append leaves part of the last frame: it was never acknowledged, so
    the store cuts it (logged) and opens with every put that returned."""
    store = LocalMetaStore(tmp_path)
    await put_each(store, ["ch_0", "ch_1"])
    await store.close()
    path = journal(tmp_path)
    whole = path.read_bytes()
    store = LocalMetaStore(tmp_path)
    await put_each(store, ["ch_0", "ch_1"], term=7)  # one frame each
    await store.close()
    grown = path.read_bytes()
    path.write_bytes(grown[: len(grown) - 5])  # the last frame torn
    again = LocalMetaStore(tmp_path)
    assert {s.name: s.record.meta.channel.term for s in await again.list_channels()} == {
        "ch_0": 7,
        "ch_1": 0,
    }
    assert "torn last batch" in caplog.text
    await put_each(again, ["ch_1"], term=8)  # appends after the cut
    await again.close()
    assert len(path.read_bytes()) > len(whole)
    reopened = LocalMetaStore(tmp_path)
    assert [s.record.meta.channel.term for s in await reopened.list_channels()] == [7, 8]
    await reopened.close()


async def test_a_missing_journal_is_reported_not_forgotten(tmp_path):
    store = LocalMetaStore(tmp_path)
    await put_each(store, ["ch_0", "ch_1"])
    await store.close()
    journal(tmp_path).unlink()
    with pytest.raises(MissingRecords, match="journal"):
        LocalMetaStore(tmp_path)
    forgotten = LocalMetaStore(tmp_path, forget_missing=True)
    assert await forgotten.list_channels() == []
    await forgotten.put_channel(record("ch_2"), None)
    await forgotten.close()
    again = LocalMetaStore(tmp_path)  # dropped explicitly once: no longer missing
    assert [s.name for s in await again.list_channels()] == ["ch_2"]
    await again.close()


def test_the_coord_refuses_to_start_without_the_journal_it_had(tmp_path):
    async def setup() -> None:
        store = LocalMetaStore(tmp_path)
        await store.put_channel(record("kept"), expected=None)
        await store.close()

    import asyncio

    asyncio.run(setup())
    journal(tmp_path).unlink()
    streamwal = os.path.join(os.path.dirname(sys.executable), "streamwal")
    run = subprocess.run(
        [streamwal, "coord", "--meta-dir", str(tmp_path), "--nodes", "1=127.0.0.1:1",
         "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if "lost its live journal" in line]
    assert len(errors) == 1 and "--forget-missing-meta" in errors[0], run.stderr
    assert "Traceback" not in run.stderr


async def test_compaction_starts_a_generation_and_keeps_every_record(tmp_path, monkeypatch):
    """Past its bound the journal is rewritten as a snapshot under the next generation;
    a crash before CURRENT names it leaves a whole new journal, adopted on open."""
    monkeypatch.setattr(mj, "COMPACT_SLACK", 4096)
    store = LocalMetaStore(tmp_path)
    names = [f"ch_{i}" for i in range(8)]
    current = (tmp_path / "CURRENT").read_bytes()
    for term in range(20):
        await put_each(store, names, term)
    assert store._journal.compactions > 0
    assert len(list(tmp_path.glob("journal.*"))) == 1
    assert journal(tmp_path).stat().st_size < 2 * store._journal.live_bytes + 4096 + 1024
    await store.close()
    (tmp_path / "CURRENT").write_bytes(current)  # as if the switch never happened
    (tmp_path / "journal.1").write_bytes(b"")  # and the old generation still there
    again = LocalMetaStore(tmp_path)
    assert {s.record.meta.channel.term for s in await again.list_channels()} == {19}
    assert len(list(tmp_path.glob("journal.*"))) == 1 and not (tmp_path / "journal.1").exists()
    await again.close()
    assert (tmp_path / "CURRENT").read_bytes() != current


async def test_a_snapshot_cut_short_is_reported_not_guessed(tmp_path):
    """The snapshot is synced before its journal is live: a journal shorter than its
    header says is damage, even when cut exactly at a frame's end."""
    for i in range(2):
        legacy_file(tmp_path / "channels" / f"ch_{i}.rec", 1, record(f"ch_{i}").SerializeToString())
    await LocalMetaStore(tmp_path).close()  # migrated: the records are journal.1's snapshot
    path = journal(tmp_path)
    path.write_bytes(path.read_bytes()[:24])  # the header alone
    with pytest.raises(CorruptRecord, match="cut short"):
        LocalMetaStore(tmp_path)


def legacy_file(path: Path, version: int, payload: bytes) -> None:
    """A record file of the earlier format (SWM1 | version | crc32 | protobuf)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack(">4sQI", b"SWM1", version, zlib.crc32(payload)) + payload)


async def test_a_directory_of_the_earlier_format_is_migrated_once(tmp_path, caplog):
    for i, version in ((0, 3), (1, 1)):
        rec = record(f"ch_{i}", term=version)
        legacy_file(tmp_path / "channels" / f"ch_{i}.rec", version, rec.SerializeToString())
    legacy_file(tmp_path / "cluster.rec", 5, cpb.ClusterRecord(incarnation=9).SerializeToString())
    task = bpb.BroadcastTask(broadcast_id=4)
    legacy_file(tmp_path / "broadcasts" / "4.rec", 2, task.SerializeToString())
    listed = cpb.ChannelManifest(names=["ch_0", "ch_1", "ch_9"]).SerializeToString()
    legacy_file(tmp_path / "manifest.rec", 1, listed)
    with pytest.raises(MissingRecords, match="ch_9"):  # the earlier format's check holds
        LocalMetaStore(tmp_path)
    legacy_file(
        tmp_path / "manifest.rec", 2, cpb.ChannelManifest(names=["ch_0"]).SerializeToString()
    )
    store = LocalMetaStore(tmp_path)
    assert "migrated" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CURRENT", "LOCK", "journal.1"]
    await store.close()
    store = LocalMetaStore(tmp_path)
    assert [(s.name, s.version) for s in await store.list_channels()] == [
        ("ch_0", "3"),
        ("ch_1", "1"),
    ]
    assert await store.get_cluster() == (cpb.ClusterRecord(incarnation=9), "5")
    assert [(b.task, b.version) for b in await store.list_broadcasts()] == [(task, "2")]
    await store.close()


async def test_a_record_over_the_limit_is_refused_and_the_store_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(mj, "MAX_ENTRY", 1024)
    store = LocalMetaStore(tmp_path)
    big = bpb.BroadcastTask(broadcast_id=1, request_id="x" * 2048)
    with pytest.raises(InvalidArgument, match="over the limit"):
        await store.put_broadcast(big, None)
    await store.put_channel(record("small"), None)
    assert await store.list_broadcasts() == []
    await store.close()
    store = LocalMetaStore(tmp_path)
    assert [s.name for s in await store.list_channels()] == ["small"]
    await store.close()


async def test_a_full_journal_refuses_puts_and_keeps_what_it_has(tmp_path, monkeypatch):
    """Past MAX_JOURNAL (live data too large to compact under it) a put is refused as
    unwritable, nothing of it written; what was written before reads back."""
    monkeypatch.setattr(mj, "MAX_JOURNAL", 4096)
    monkeypatch.setattr(mj, "COMPACT_SLACK", 1 << 20)  # no compaction in this test
    store = LocalMetaStore(tmp_path)
    terms = {}
    with pytest.raises(MetaStoreUnwritable, match="would pass 4096 bytes"):
        for term in range(1, 1000):
            await put_each(store, ["ch_0"], term)
            terms["ch_0"] = term
    await store.close()
    again = LocalMetaStore(tmp_path)
    assert [s.record.meta.channel.term for s in await again.list_channels()] == [terms["ch_0"]]
    await again.close()


def test_kill_9_while_writing_leaves_whole_records(tmp_path):
    """A writer killed mid-batch (64 puts at once, journal compacted now and then):
    every record reads back intact at a term at least the last acknowledged one."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        from streamwal.coord import meta_journal
        from streamwal.coord.meta_store import LocalMetaStore
        from streamwal.coord import state_machine as sm
        from streamwal.proto import coord_pb2 as cpb
        meta_journal.COMPACT_SLACK = 64 << 10
        async def main():
            store = LocalMetaStore({str(tmp_path)!r})
            versions = {{}}
            async def put(i, term):
                rec = cpb.ChannelRecord(meta=sm.new_channel(f"ch_{{i}}"))
                rec.meta.channel.term = term
                versions[i] = (await store.put_channel(rec, versions.get(i))).version
            for term in range(1, 100000):
                await asyncio.gather(*(put(i, term) for i in range(64)))
                print(term, flush=True)
        asyncio.run(main())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        acked = 0
        for line in proc.stdout:
            acked = int(line)
            if acked >= 40:
                break
        time.sleep(random.uniform(0, 0.01))  # somewhere in the next batch
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    import asyncio

    async def check():
        store = LocalMetaStore(tmp_path)
        terms = [s.record.meta.channel.term for s in await store.list_channels()]
        await store.close()
        return terms

    terms = asyncio.run(check())
    assert acked >= 40
    assert len(terms) == 64
    assert all(t >= acked for t in terms)


async def test_concurrent_puts_share_flushes_and_all_survive(tmp_path):
    """A burst of puts (a placement of many pchannels) is a few durable writes, not one
    each, and every record is there after a reopen."""
    import asyncio

    store = LocalMetaStore(tmp_path)
    names = [f"burst_{i}" for i in range(300)]
    stored = await asyncio.gather(*(store.put_channel(record(n), None) for n in names))
    await asyncio.gather(
        *(store.put_channel(record(n, 1), s.version) for n, s in zip(names, stored, strict=True))
    )
    assert store._commit.flushes < 60  # 600 puts
    await store.close()
    reopened = LocalMetaStore(tmp_path)
    listed = {s.record.meta.channel.name: s for s in await reopened.list_channels()}
    assert set(listed) == set(names)
    assert {s.record.meta.channel.term for s in listed.values()} == {1}
    await reopened.close()
