"""A new store starts on a recycled WAL file: the filler is gone, the file stays."""

from __future__ import annotations

from pathlib import Path

from rocksdict import ReadOptions

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.node.log_store import LogStore
from tests.node.helpers import read_data

MIB = 1 << 20


def _wal_files(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.glob("*.log")}


def _keys(store: LogStore) -> list[bytes]:
    it = store._db.iter(ReadOptions())
    it.seek_to_first()
    keys = []
    while it.valid():
        keys.append(it.key())
        it.next()
    return keys


def test_a_new_store_leaves_a_recycled_wal_and_no_filler(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "db", wal_prewarm_bytes=8 * MIB)
    try:
        assert max(_wal_files(tmp_path / "db").values()) >= 8 * MIB  # the live, recycled WAL
        assert _keys(store) == []
        assert not list((tmp_path / "db").glob("*.sst"))  # the filler was compacted away
    finally:
        store.close()
    # An existing store is not pre-warmed again (its own WALs are recycled on recovery).
    before = {p.name for p in (tmp_path / "db").iterdir()}
    LogStore(tmp_path / "db", wal_prewarm_bytes=8 * MIB).close()
    after = {p.name for p in (tmp_path / "db").iterdir()}
    assert not any(n.endswith(".sst") for n in after - before)


async def test_a_prewarmed_node_appends_into_the_recycled_file(start_node, pchannel) -> None:
    node = start_node("warm", "--wal-prewarm", "8MiB")
    wal_before = _wal_files(node.data_dir)
    live = max(wal_before, key=wal_before.get)
    assert wal_before[live] >= 8 * MIB
    async with NodeClient(node.address) as client:
        await client.assign(pchannel, 1)
        producer = await client.producer(pchannel, 1)
        sent = [b"w%d" % i for i in range(200)]
        for p in sent:
            await producer.send(p)
        await producer.close()
        consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
        assert [m.payload for m in await read_data(consumer, 200)] == sent
        await consumer.close()
    # The appends overwrote the recycled file instead of growing a new one.
    assert _wal_files(node.data_dir)[live] == wal_before[live]
