"""Transactions through the accessor, against a real coord and nodes: a committed txn's
messages appear together, contiguous, with the commit's tick; a rolled-back one never;
append_messages appends a vchannel's several messages as one txn, per-message answers."""

from __future__ import annotations

import pytest

from streamwal.client.aio import AppendOption, DeliverPolicy, Message, connect
from streamwal.errors import InvalidArgument, InvalidTransactionState
from tests.support import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def read_all(wal, vchannel: str, count: int) -> list:
    got: list = []
    scanner = wal.read(vchannel, DeliverPolicy.all(), handler=got.append)
    try:
        await wait_for(lambda: len(got) >= count, 10, what=f"{count} messages on {vchannel}")
    finally:
        await scanner.close()
    return got


async def test_commit_appears_together_and_rollback_never(cluster) -> None:
    v = f"{cluster.pchannels[0]}_txn"
    async with await connect(coord=cluster.coord_address) as wal:
        async with await wal.txn(v, keepalive=5) as txn:
            for i in range(3):
                await txn.append(Message(v, b"t%d" % i, properties={"i": str(i)}))
        committed = txn.result
        assert committed.count == 3
        with pytest.raises(InvalidTransactionState):
            await txn.commit()  # once only

        with pytest.raises(RuntimeError):
            async with await wal.txn(v) as doomed:
                await doomed.append(b"never")
                raise RuntimeError("the application failed mid-txn: rolled back")
        with pytest.raises(InvalidArgument, match="writes"):
            await (await wal.txn(v)).append(Message(f"{v}_other", b"wrong vchannel"))
        marker = await wal.raw_append(Message(v, b"after"))

        got = await read_all(wal, v, 4)
        assert [m.payload for m in got] == [b"t0", b"t1", b"t2", b"after"]
        assert [m.offset for m in got[:3]] == committed.message_ids
        assert {m.time_tick for m in got[:3]} == {committed.time_tick}
        assert got[3].offset == marker.message_id
        assert wal.latest_mvcc_timestamp_if_local(v) >= committed.time_tick


async def test_append_messages_groups_are_transactions(cluster) -> None:
    a, b = f"{cluster.pchannels[1]}_amt", f"{cluster.pchannels[2]}_amt"
    async with await connect(coord=cluster.coord_address) as wal:
        responses = await wal.append_messages(
            Message(a, b"a0"),
            Message(b, b"b0"),
            Message(a, b"a1"),
            Message(b, b"b1", properties={"_bad": "reserved"}),  # spoils group b
            Message(a, b"a2"),
        )
        ok = [responses[i].result for i in (0, 2, 4)]
        assert len({r.txn_id for r in ok}) == 1 and ok[0].txn_id is not None
        assert len({r.time_tick for r in ok}) == 1, "one txn: the commit's tick for all"
        assert [r.message_id for r in ok] == list(range(ok[0].message_id, ok[0].message_id + 3))
        assert all(isinstance(responses[i].error, InvalidArgument) for i in (1, 3))

        barrier = ok[0].time_tick + (3000 << 18)
        later = await wal.append_messages_with_option(
            AppendOption(barrier_time_tick=barrier), Message(a, b"a3"), Message(a, b"a4")
        )
        assert all(r.time_tick > barrier for r in later.unwrap())

        # Group b left nothing behind: its first message is the one appended now.
        await wal.raw_append(Message(b, b"b-only"))
        got_a = await read_all(wal, a, 5)
        got_b = await read_all(wal, b, 1)
        assert [m.payload for m in got_a] == [b"a0", b"a1", b"a2", b"a3", b"a4"]
        assert [m.payload for m in got_b] == [b"b-only"]
