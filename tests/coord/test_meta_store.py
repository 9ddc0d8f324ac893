"""LocalMetaStore: compare-and-put, durability across processes, exclusive ownership."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from streamwal.coord import state_machine as sm
from streamwal.coord.meta_store import (
    CorruptRecord,
    LocalMetaStore,
    MetaStoreBusy,
    MissingRecords,
    VersionConflict,
)
from streamwal.errors import InvalidArgument
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


async def test_corrupt_record_is_reported_not_guessed(tmp_path):
    store = LocalMetaStore(tmp_path)
    await store.put_channel(record("ch_0"), expected=None)
    await store.close()
    path = tmp_path / "channels" / "ch_0.rec"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord):
        LocalMetaStore(tmp_path)


async def test_a_deleted_record_is_reported_not_forgotten(tmp_path):
    store = LocalMetaStore(tmp_path)
    for i in range(3):
        await store.put_channel(record(f"ch_{i}"), expected=None)
    await store.close()
    (tmp_path / "channels" / "ch_1.rec").unlink()
    with pytest.raises(MissingRecords, match="ch_1"):
        LocalMetaStore(tmp_path)
    forgotten = LocalMetaStore(tmp_path, forget_missing=True)
    assert [s.name for s in await forgotten.list_channels()] == ["ch_0", "ch_2"]
    await forgotten.close()
    again = LocalMetaStore(tmp_path)  # dropped explicitly once: no longer missing
    assert [s.name for s in await again.list_channels()] == ["ch_0", "ch_2"]
    await again.close()


def test_the_coord_refuses_to_start_without_a_record_it_had(tmp_path):
    async def setup() -> None:
        store = LocalMetaStore(tmp_path)
        await store.put_channel(record("kept"), expected=None)
        await store.put_channel(record("gone"), expected=None)
        await store.close()

    import asyncio

    asyncio.run(setup())
    (tmp_path / "channels" / "gone.rec").unlink()
    streamwal = os.path.join(os.path.dirname(sys.executable), "streamwal")
    run = subprocess.run(
        [streamwal, "coord", "--meta-dir", str(tmp_path), "--nodes", "1=127.0.0.1:1",
         "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if "gone" in line]
    assert len(errors) == 1 and "lost the records" in errors[0], run.stderr
    assert "Traceback" not in run.stderr


def test_kill_9_while_writing_leaves_whole_records(tmp_path):
    """A writer killed mid-loop: every record reads back intact at some acked term."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        from streamwal.coord.meta_store import LocalMetaStore
        from streamwal.coord import state_machine as sm
        from streamwal.proto import coord_pb2 as cpb
        async def main():
            store = LocalMetaStore({str(tmp_path)!r})
            versions = {{}}
            for term in range(1, 100000):
                for i in range(4):
                    rec = cpb.ChannelRecord(meta=sm.new_channel(f"ch_{{i}}"))
                    rec.meta.channel.term = term
                    s = await store.put_channel(rec, versions.get(i))
                    versions[i] = s.version
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
            if acked >= 20:
                break
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
    assert len(terms) == 4
    assert all(t >= acked for t in terms)


async def test_concurrent_puts_share_flushes_and_all_survive(tmp_path):
    """A burst of puts (a placement of many pchannels) is a few durable writes, not one
    each, and every record and the manifest listing them are there after a reopen."""
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
