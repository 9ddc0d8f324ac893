"""New pchannels' ledger slots (node/ack_ledger.py) are durable before anything of theirs
is, with one sync for a batch of them: a failover hands a node hundreds of pchannels new
to it in one Assign batch, and a sync per slot took a second on a busy machine (issue 24).
A real Wal over RocksDB, in-process."""

from __future__ import annotations

import asyncio
import os

import pytest

from streamwal.node.ack_ledger import AckLedger
from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.wal import Wal


def make_wal(path) -> Wal:
    wal = Wal(LogStore(path), NodeConfig(node_id=1), NodeMetrics())
    wal.open()
    wal.start()
    return wal


async def test_a_batch_of_new_pchannels_shares_one_slot_sync(tmp_path, monkeypatch) -> None:
    wal = make_wal(tmp_path / "node")
    synced: list[int] = []
    real = wal.ledger.sync_slots

    def counted() -> None:
        if wal.ledger.unsynced:
            synced.append(len(wal.ledger.names()))
        real()

    monkeypatch.setattr(wal.ledger, "sync_slots", counted)
    names = [f"new_{i}" for i in range(64)]
    try:
        await asyncio.gather(*(wal.assign(n, 1) for n in names))
        assert synced == [64]  # every slot allocated before the one sync
        await wal.fence("new_0", 2)  # a pchannel with a slot already: no sync
        assert synced == [64]
    finally:
        await wal.close()
        wal.store.close()
    reopened = AckLedger(tmp_path / "node")
    assert sorted(reopened.names()) == sorted(names)
    reopened.close()


async def test_a_failed_slot_sync_leaves_no_pchannel_and_is_tried_again(
    tmp_path, monkeypatch
) -> None:
    wal = make_wal(tmp_path / "node")
    real_fsync = os.fsync

    def failing(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    try:
        monkeypatch.setattr(os, "fsync", failing)
        with pytest.raises(OSError):
            await wal.assign("ch", 1)
        assert "ch" not in wal.channels and wal.ledger.unsynced
        monkeypatch.setattr(os, "fsync", real_fsync)
        await wal.assign("ch", 1)  # the slot kept in memory is synced now, before its meta
        assert not wal.ledger.unsynced and wal.channels["ch"].core.known
    finally:
        await wal.close()
        wal.store.close()


async def test_a_slot_a_failed_assign_left_is_not_taken_for_a_lost_meta(tmp_path) -> None:
    """An Assign of a pchannel new here that fails after its slot is made (a full disk)
    leaves the slot, which cannot be freed; after a restart that is nothing lost (no
    mark, no record), while a slot that covers acknowledged offsets without its meta is."""
    make_store = LogStore(tmp_path / "node")  # the node's directory, as a node made it
    make_store.close()
    ledger = AckLedger(tmp_path / "node")
    ledger.slot("ghost")  # what the failed Assign left
    ledger.advance(ledger.slot("gone"), 7)  # acknowledged up to 7, then its meta vanished
    ledger.close()
    wal = make_wal(tmp_path / "node")
    try:
        assert "ghost" not in wal.channels
        assert wal.channels["gone"].core.damage  # refused until the loss is dealt with
        await wal.assign("ghost", 1)  # and it can be assigned here later
        assert wal.channels["ghost"].core.known
    finally:
        await wal.close()
        wal.store.close()
