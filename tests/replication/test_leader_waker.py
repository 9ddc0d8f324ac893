"""A leader's stream to an idle follower over the replication port writes a one-at-a-time
send's record from its waker, as the group goes to the disk, with no task wake-up; a
socket that does not take the frame at once leaves it to the stream's task; a commit
update alone goes out COMMIT_LAG_S later the same way. In-process, on a real Wal over
RocksDB (node/replication.py, LeaderStream)."""

from __future__ import annotations

import asyncio

from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.wal import Wal
from streamwal.proto import streaming_pb2 as pb

BODY = pb.MessageBatch(messages=[pb.Message(payload=b"m")]).SerializeToString()


def _members() -> pb.ReplicaSet:
    nodes = [pb.StreamingNodeInfo(server_id=i, address=f"127.0.0.1:{i}") for i in (1, 2, 3)]
    return pb.ReplicaSet(role=pb.REPLICA_ROLE_LEADER, members=nodes, leader=nodes[0])


async def _until(check, seconds: float = 2.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


async def test_an_idle_followers_records_go_out_from_the_waker(tmp_path) -> None:
    wal = Wal(LogStore(tmp_path / "node"), NodeConfig(node_id=1), NodeMetrics())
    wal.open()
    wal.start()
    now: list[pb.LogEntry] = []  # written by the waker (write_now)
    later: list[pb.LogEntry] = []  # written by the stream's task (write)
    takes = [True]

    def write_now(body: bytes) -> bool:
        if takes[0]:
            now.append(pb.LogEntry.FromString(body))
        return takes[0]

    async def write(entry: pb.LogEntry | bytes) -> None:
        later.append(entry if isinstance(entry, pb.LogEntry) else pb.LogEntry.FromString(entry))

    try:
        await wal.assign("ch", 1, replica_set=_members())
        ch = wal.channels["ch"]
        first = pb.ReplicaAck(pchannel="ch", term=1, node_id=2, replica=1, batched=True)
        stream = wal.replication.open_stream(first, write, "port", write_now)
        task = asyncio.ensure_future(wal.replication.serve(stream))
        # The first entry and the assign's time tick are out, the commit is sent: asleep.
        await _until(lambda: stream._wake is not None and stream.position == ch.next_offset)
        asleep, sent, base = stream._wake, len(later), ch.next_offset

        # Sent as the group goes to the disk, before its write ends, by the waker.
        written = wal.append(ch, 1, BODY, 1)
        await _until(lambda: bool(now))
        assert (now[0].offset, now[0].record) == (base, ch.cached_from(base, 1, 1 << 20)[0][1])
        assert stream._wake is asleep and len(later) == sent  # the task slept through it
        await written

        # The follower acknowledges: the commit update goes out alone COMMIT_LAG_S later.
        ack = pb.ReplicaAck(pchannel="ch", term=1, node_id=2, acked_offset=base + 1)
        assert stream.take(ack)
        assert ch.known_commit == base + 1
        await _until(lambda: len(now) == 2)
        assert (now[1].commit_offset, now[1].record, stream._wake) == (base + 1, b"", asleep)

        # A socket that does not take the frame at once: the task writes it and waits.
        takes[0] = False
        await wal.append(ch, 1, BODY, 1)
        await _until(lambda: len(later) == sent + 1)
        assert (later[-1].offset, len(now)) == (base + 1, 2)
        assert stream._wake is not asleep
        stream.end(None)
        await asyncio.wait_for(task, 2.0)
    finally:
        await wal.close()
        wal.store.close()
