"""SyncedWriter: writes of one loop turn share a flush, and every flush runs on the
writer's thread, so the loop serves while the disk is slow (node/synced_writer.py)."""

from __future__ import annotations

import asyncio
import threading
import time

from rocksdict import WriteBatch

from streamwal.node.store_thread import StoreThread
from streamwal.node.synced_writer import SyncedWriter


class _Store:
    """Records which thread made each synced flush and of how many batches."""

    def __init__(self, delay: float = 0.0) -> None:
        self.flushes: list[tuple[int, int]] = []
        self.delay = delay

    def write_synced_many(self, wbs: list[WriteBatch]) -> None:
        time.sleep(self.delay)
        self.flushes.append((threading.get_ident(), len(wbs)))


async def test_every_flush_runs_on_the_thread_a_burst_shares_one() -> None:
    store = _Store()
    writer = SyncedWriter(store, StoreThread())  # type: ignore[arg-type]
    loop_thread = threading.get_ident()
    await writer.write(WriteBatch())
    await asyncio.gather(*(writer.write(WriteBatch()) for _ in range(5)))
    assert [batches for _, batches in store.flushes] == [1, 5]  # one fsync for the turn's five
    assert all(thread != loop_thread for thread, _ in store.flushes)
    await writer.close()


async def test_the_loop_serves_while_a_flush_waits_for_the_disk() -> None:
    """A lone write on a stalled disk: the loop's timers (a follower's heartbeats) run on."""
    store = _Store(delay=0.5)
    writer = SyncedWriter(store, StoreThread())  # type: ignore[arg-type]
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    started = time.monotonic()
    await writer.write(WriteBatch())
    ticker.cancel()
    during = [t for t in ticks if t > started]
    assert len(during) >= 5, f"the loop ran {len(during)} timers in a 0.5 s flush"
    await writer.close()


async def test_close_flushes_a_write_not_started_yet() -> None:
    store = _Store()
    writer = SyncedWriter(store, StoreThread())  # type: ignore[arg-type]
    done = writer.write(WriteBatch())
    await writer.close()
    assert done.done() and store.flushes


async def test_a_failed_threaded_flush_fails_its_writes_and_the_next_goes_on() -> None:
    store = _Store()
    writer = SyncedWriter(store, StoreThread())  # type: ignore[arg-type]
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
