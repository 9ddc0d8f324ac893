"""A follower whose write of copied records fails goes back to what its disk holds, so the
next copy continues there: no hole in its log (found by the simulator, seed 1 of its
first runs). In-process: a real Wal over RocksDB, the follower's apply called directly."""

from __future__ import annotations

import pytest

from streamwal.node import records
from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.replica import FollowerRole
from streamwal.node.wal import Wal
from streamwal.proto import streaming_pb2 as pb


def entry(term: int, offset: int, count: int) -> pb.LogEntry:
    body = pb.MessageBatch(messages=[pb.Message(payload=b"m")] * count).SerializeToString()
    return pb.LogEntry(term=term, offset=offset, record=records.encode(term, 1, count, body))


async def test_a_failed_write_leaves_no_hole(tmp_path) -> None:
    wal = Wal(LogStore(tmp_path / "node"), NodeConfig(node_id=2), NodeMetrics())
    wal.open()
    wal.start()
    try:
        follower = pb.ReplicaSet(
            role=pb.REPLICA_ROLE_FOLLOWER,
            members=[
                pb.StreamingNodeInfo(server_id=1, address="127.0.0.1:1"),
                pb.StreamingNodeInfo(server_id=2, address="127.0.0.1:2"),
            ],
            leader=pb.StreamingNodeInfo(server_id=1, address="127.0.0.1:1"),
        )
        await wal.assign("ch", 1, replica_set=follower)
        ch = wal.channels["ch"]
        role = ch.replica
        assert isinstance(role, FollowerRole)
        real = wal.store.write_synced

        def full(_wb) -> None:
            raise OSError(28, "No space left on device")

        wal.store.write_synced = full
        with pytest.raises(OSError):
            await wal.replication._apply(ch, role, [entry(1, 0, 3)])
        assert (ch.committed_next, ch.next_offset) == (0, 0)  # not past what is on disk
        wal.store.write_synced = real
        assert await wal.replication._apply(ch, role, [entry(1, 0, 3), entry(1, 3, 2)])
        assert ch.committed_next == 5
        assert [base for base, _ in wal.store.records_from("ch", 0, 10, 1 << 20)] == [0, 3]
    finally:
        await wal.close()
        wal.store.close()
