"""Two node bugs the simulator (streamwal.testing.sim) found, pinned on a real Wal over
RocksDB, in-process (the follower's apply and the fence called directly):

- a follower whose write of copied records fails goes back to what its disk holds, so
  the next copy continues there: no hole in its log;
- a Fence reports the term of the last record, not the term it just raised: writes in
  flight when it came finish under their own term (else a stale log looks newest and
  the coord chooses it, cutting committed records elsewhere).
"""

from __future__ import annotations

import asyncio

import pytest

from streamwal.node import records
from streamwal.node.channel import Channel
from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.replication import entries
from streamwal.node.steps import Drive
from streamwal.node.wal import Wal
from streamwal.proto import streaming_pb2 as pb


def entry(term: int, offset: int, count: int) -> pb.LogEntry:
    body = pb.MessageBatch(messages=[pb.Message(payload=b"m")] * count).SerializeToString()
    return pb.LogEntry(term=term, offset=offset, record=records.encode(term, 1, count, body))


async def apply(wal: Wal, ch: Channel, got: list[pb.LogEntry]) -> bool:
    """A follower's apply of its leader's entries, driven as its stream drives it."""
    done = asyncio.get_running_loop().create_future()

    def then(changed: bool, err: BaseException | None) -> None:
        if err is None:
            done.set_result(changed)
        else:
            done.set_exception(err)

    Drive(ch.core.apply(entries(got)), wal.stepper(ch), then).start()
    return await done


def make_wal(path) -> Wal:
    wal = Wal(LogStore(path), NodeConfig(node_id=2), NodeMetrics())
    wal.open()
    wal.start()
    return wal


async def test_a_fence_reports_the_last_records_term_not_its_own(tmp_path) -> None:
    wal = make_wal(tmp_path / "node")
    try:
        await wal.assign("ch", 1)
        ch = wal.channels["ch"]
        body = pb.MessageBatch(messages=[pb.Message(payload=b"m")]).SerializeToString()
        written = wal.append(ch, 1, body, 1)  # in flight when the fence comes
        last_term, end, _, damage = await wal.fence("ch", 3)
        assert (last_term, end, damage) == (1, 1, "")
        assert await written == (0, written.result()[1])
    finally:
        await wal.close()
        wal.store.close()


async def test_a_failed_write_leaves_no_hole(tmp_path) -> None:
    wal = make_wal(tmp_path / "node")
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
        real = wal.store.write_synced_many

        def full(_wbs) -> None:  # what the synced writer calls
            raise OSError(28, "No space left on device")

        wal.store.write_synced_many = full
        with pytest.raises(OSError):
            await apply(wal, ch, [entry(1, 0, 3)])
        assert (ch.committed_next, ch.next_offset) == (0, 0)  # not past what is on disk
        wal.store.write_synced_many = real
        assert await apply(wal, ch, [entry(1, 0, 3), entry(1, 3, 2)])
        assert ch.committed_next == 5
        assert [base for base, _ in wal.store.records_from("ch", 0, 10, 1 << 20)] == [0, 3]
    finally:
        await wal.close()
        wal.store.close()
