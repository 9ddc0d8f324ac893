"""A follower applies its leader's entries as its link hands them over, from callbacks
(replication.FollowerStream, steps.Drive): in order, one batch at a time, what arrives
while a batch is on the disk applied after it, each ack sent only once what it counts is
durable; a heartbeat goes out at once, also while a batch is on the disk, repeating the
end last acknowledged (never records still on their way to the disk); a rejected entry,
a failed write or the link's end ends the stream with its error. In-process, on a real
Wal over RocksDB, with a stand-in link."""

from __future__ import annotations

import asyncio
import struct

import pytest

from streamwal.errors import Inner
from streamwal.node import records
from streamwal.node import replication_rules as rules
from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.replication import FollowerStream
from streamwal.node.wal import Wal
from streamwal.proto import streaming_pb2 as pb

BODY = pb.MessageBatch(messages=[pb.Message(payload=b"m")]).SerializeToString()


class _Link:
    """Records the acks, and what the follower's disk held when each was sent."""

    def __init__(self, wal: Wal) -> None:
        self.wal = wal
        self.acks: list[tuple[int, int]] = []  # (acked end, records durable then)
        self.took_count = 0

    def send(self, ack: pb.ReplicaAck) -> None:
        held = self.wal.store.records_from("ch", 0, 100)
        self.acks.append((ack.acked_offset, len(held)))

    def took(self) -> None:
        self.took_count += 1


def _entry(offset: int, term: int = 1) -> pb.LogEntry:
    return pb.LogEntry(term=term, offset=offset, record=records.encode(term, 1, 1, BODY))


async def _follower(tmp_path) -> tuple[Wal, FollowerStream, _Link]:
    wal = Wal(LogStore(tmp_path / "node"), NodeConfig(node_id=2), NodeMetrics())
    wal.open()
    wal.start()
    nodes = [pb.StreamingNodeInfo(server_id=i, address=f"127.0.0.1:{i}") for i in (1, 2)]
    rs = pb.ReplicaSet(role=pb.REPLICA_ROLE_FOLLOWER, members=nodes, leader=nodes[0])
    await wal.assign("ch", 1, replica_set=rs)
    role, task = wal.replication._following["ch"]
    task.cancel()  # no leader at 127.0.0.1:1: the stream is driven here
    link = _Link(wal)
    return wal, FollowerStream(wal.replication, wal.channels["ch"], role, link), link


async def _closed(wal: Wal, stream: FollowerStream) -> None:
    stream.close()
    await wal.close()
    wal.store.close()


async def test_entries_apply_in_order_and_each_ack_counts_only_durable_records(
    tmp_path,
) -> None:
    wal, stream, link = await _follower(tmp_path)
    loop = asyncio.get_running_loop()
    held: list[tuple[asyncio.Future, asyncio.Future]] = []  # (the real write, released)
    real = wal.synced.write

    def write(wb) -> asyncio.Future:
        held.append((real(wb), loop.create_future()))
        return held[-1][1]

    async def release() -> None:
        inner, outer = held[-1]
        await inner
        outer.set_result(None)
        for _ in range(3):  # its done callback, then the ack
            await asyncio.sleep(0)

    wal.synced.write = write  # type: ignore[method-assign]
    try:
        stream.beat()  # no batch applied yet: nothing the leader could count on
        assert stream.offer([_entry(0)])
        assert len(held) == 1 and not link.acks  # on the disk: not acknowledged yet
        stream.beat()
        assert not link.acks
        assert stream.offer([_entry(1)]) and stream.offer([_entry(2)])
        assert len(held) == 1  # they wait for the batch on the disk
        await release()
        assert [end for end, _ in link.acks] == [1]
        assert len(held) == 2  # both applied as the next batch
        stream.beat()  # at once, while the batch is on the disk: the end acknowledged
        assert [end for end, _ in link.acks] == [1, 1]
        await release()
        assert [end for end, _ in link.acks] == [1, 1, 3]
        assert wal.channels["ch"].committed_next == 3
        # The link's end, behind a record: the record is applied and acknowledged first.
        stream.offer([_entry(3), Inner("the leader closed the replication stream")])
        await release()
        with pytest.raises(Inner):
            await asyncio.wait_for(stream.done, 2)
        assert [end for end, _ in link.acks] == [1, 1, 3, 4]
        assert all(end <= durable for end, durable in link.acks)
    finally:
        await _closed(wal, stream)


def _corrupt() -> pb.LogEntry:
    entry = _entry(0)
    entry.record = entry.record[:-1] + bytes([entry.record[-1] ^ 1])
    return entry


@pytest.mark.parametrize("bad", ["term", "offset", "corrupt", "short", "disk"])
async def test_a_bad_entry_or_a_failed_write_ends_the_stream_unacknowledged(
    tmp_path, bad: str
) -> None:
    wal, stream, link = await _follower(tmp_path)
    try:
        got = {
            "term": [_entry(0, term=2)],
            "offset": [_entry(5)],
            "corrupt": [_corrupt()],  # fails its checksum
            "short": [pb.LogEntry(term=1, offset=0, record=b"abc")],  # not even a header
            "disk": [_entry(0)],
        }[bad]
        if bad == "disk":

            def full(_wbs) -> None:
                raise OSError(28, "No space left on device")

            wal.store.write_synced_many = full  # type: ignore[method-assign]
        stream.offer([*got, _entry(1)])
        error = {"corrupt": records.CorruptRecord, "short": struct.error, "disk": OSError}
        with pytest.raises(error.get(bad, rules.Rejected)):
            await asyncio.wait_for(stream.done, 2)
        assert not link.acks
        assert wal.channels["ch"].committed_next == 0  # nothing after it, nothing undurable
    finally:
        await _closed(wal, stream)
