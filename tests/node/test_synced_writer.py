"""SyncedWriter: writes of one loop turn share a flush; a lone small one runs on the loop
unless writes queue up or the disk was slow (node/synced_writer.py)."""

from __future__ import annotations

import asyncio
import threading
import time

from rocksdict import WriteBatch

from streamwal.node.group_commit import InlineRule
from streamwal.node.synced_writer import SyncedWriter


class _Store:
    """Records which thread made each synced flush and of how many batches."""

    def __init__(self, delay: float = 0.0) -> None:
        self.flushes: list[tuple[int, int]] = []
        self.delay = delay

    def write_synced_many(self, wbs: list[WriteBatch]) -> None:
        time.sleep(self.delay)
        self.flushes.append((threading.get_ident(), len(wbs)))


async def test_a_lone_write_runs_on_the_loop_a_burst_shares_one_threaded_flush() -> None:
    store = _Store()
    writer = SyncedWriter(store)  # type: ignore[arg-type]
    loop_thread = threading.get_ident()
    await writer.write(WriteBatch())
    assert store.flushes == [(loop_thread, 1)]
    await asyncio.gather(*(writer.write(WriteBatch()) for _ in range(5)))
    assert len(store.flushes) == 2
    thread, batches = store.flushes[1]
    assert thread != loop_thread and batches == 5  # one fsync for the turn's five
    await writer.close()


async def test_after_a_slow_flush_lone_writes_stay_off_the_loop() -> None:
    store = _Store(delay=0.02)
    writer = SyncedWriter(store, InlineRule(slow_s=0.01, hold_s=60.0))  # type: ignore[arg-type]
    loop_thread = threading.get_ident()
    await writer.write(WriteBatch())  # inline, and slow: the rule holds writes off the loop
    await writer.write(WriteBatch())
    assert [t == loop_thread for t, _ in store.flushes] == [True, False]
    await writer.close()


async def test_close_flushes_a_write_not_started_yet() -> None:
    store = _Store()
    writer = SyncedWriter(store)  # type: ignore[arg-type]
    done = writer.write(WriteBatch())
    await writer.close()
    assert done.done() and store.flushes


async def test_a_failed_threaded_flush_fails_its_writes_and_the_next_goes_on() -> None:
    store = _Store()
    writer = SyncedWriter(store)  # type: ignore[arg-type]
    real = store.write_synced_many

    def failing(wbs: list[WriteBatch]) -> None:
        raise OSError(28, "No space left on device")

    store.write_synced_many = failing  # type: ignore[method-assign]
    burst = await asyncio.gather(
        *(writer.write(WriteBatch()) for _ in range(3)), return_exceptions=True
    )
    assert [type(e) for e in burst] == [OSError] * 3
    store.write_synced_many = real  # type: ignore[method-assign]
    await asyncio.gather(*(writer.write(WriteBatch()) for _ in range(3)))
    assert len(store.flushes) == 1 and store.flushes[0][0] != threading.get_ident()
    await writer.close()
