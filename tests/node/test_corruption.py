"""A single copy whose store lost acknowledged records: detected, refused, never re-acknowledged.

RocksDB's WAL recovery stops at the first damaged record and drops the rest without an
error; a damaged table block turns a scan into an early end. The node must notice both
(the acknowledged-offset ledger, checksums on every read and a verification before it
leads a log an earlier process wrote) and refuse the pchannel with DATA_LOSS until the
loss is accepted, after which no offset is ever acknowledged a second time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import DataLoss
from streamwal.testing.local_node import free_port
from tests.node.helpers import read_data, sample, scrape

PAYLOAD = 1000


def flip_middle(path: Path, length: int = 16) -> None:
    """Invert `length` bytes in the middle of a file (a damaged sector)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        data = f.read(length)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in data))
        f.flush()
        os.fsync(f.fileno())


def newest(directory: Path, suffix: str) -> Path:
    files = sorted(directory.glob(f"*{suffix}"), key=lambda p: int(p.stem))
    files = [p for p in files if p.stat().st_size > 0]
    assert files, f"no {suffix} file in {directory}"
    return files[-1]


async def produce(node, pchannel: str, count: int) -> list[int]:
    """`count` acknowledged 1 KB messages under term 1; their offsets."""
    offsets: list[int] = []
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        for start in range(0, count, 100):
            batch = [os.urandom(PAYLOAD) for _ in range(min(100, count - start))]
            offsets += [r.offset for r in await producer.send_many(batch)]
        await producer.close()
    return offsets


async def assert_refused_then_accepted(node, pchannel: str, acked: list[int]) -> None:
    """Assign under the next term is refused naming the loss; accepted, the pchannel
    serves again and its next offset is above every acknowledged one."""
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        with pytest.raises(DataLoss, match="acknowledged"):
            await c.assign(pchannel, 2)
        status = await c.collect_status()
        assert pchannel not in {s.pchannel.name for s in status.channels}
        await c.assign(pchannel, 3, accept_data_loss=True)
        producer = await c.producer(pchannel, 3)
        after = await producer.send(b"after the loss")
        await producer.close()
        assert after.offset > max(acked)
        consumer = await c.consumer(
            pchannel, 3, DeliverPolicy.start_from(after.offset), time_ticks=False
        )
        assert (await read_data(consumer, 1))[0].payload == b"after the loss"
        await consumer.close()


async def test_a_flipped_wal_record_is_a_detected_loss_not_a_silent_one(
    start_node, pchannel
) -> None:
    node = start_node("n1")
    acked = await produce(node, pchannel, 3000)
    node.kill()
    flip_middle(newest(node.data_dir, ".log"))
    port = free_port()
    node = start_node("n1", "--metrics", f"127.0.0.1:{port}")
    samples = scrape(port)
    assert sample(samples, "streamwal_pchannel_data_loss", pchannel=pchannel) == 1
    assert sample(samples, "streamwal_corruption_detected_total", found_by="ledger") == 1
    await assert_refused_then_accepted(node, pchannel, acked)
    assert sample(scrape(port), "streamwal_pchannel_data_loss", pchannel=pchannel) == 0


async def test_a_flipped_table_block_is_found_before_the_pchannel_is_served(
    start_node, pchannel
) -> None:
    node = start_node("n1")
    acked = await produce(node, pchannel, 3000)
    node.kill()
    db = Rdict(str(node.data_dir), Options(raw_mode=True))  # what a memtable flush leaves
    db.flush()
    db.close()
    flip_middle(newest(node.data_dir, ".sst"))
    node = start_node("n1")  # verified before serving: salvaged at once
    assert list(node.data_dir.parent.glob("n1.damaged-*"))
    await assert_refused_then_accepted(node, pchannel, acked)
