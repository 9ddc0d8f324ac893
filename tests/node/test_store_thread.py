"""StoreThread: the group commit's writes and the synced writer's flushes run one after
another on one thread, never beside each other (node/store_thread.py)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from rocksdict import WriteBatch

from streamwal.node.group_commit import GroupCommitter, InlineRule
from streamwal.node.store_thread import StoreThread
from streamwal.node.synced_writer import SyncedWriter


class _Store:
    """Records each write's span and thread; every write takes `delay` (an fsync)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.spans: list[tuple[str, float, float, int]] = []

    def _span(self, kind: str) -> None:
        start = time.monotonic()
        time.sleep(self.delay)
        self.spans.append((kind, start, time.monotonic(), threading.get_ident()))

    def new_batch(self) -> WriteBatch:
        return WriteBatch()

    def write(self, wb: WriteBatch) -> None:
        self._span("group")

    def write_synced_many(self, wbs: list[WriteBatch]) -> None:
        self._span("synced")


class _Item:
    def __init__(self) -> None:
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.channel = None


async def test_group_writes_and_synced_flushes_never_overlap() -> None:
    store = _Store(delay=0.02)
    thread = StoreThread()

    def committed(group: list[_Item]) -> None:
        for item in group:
            item.future.set_result(None)

    def failed(group: list[_Item], exc: BaseException) -> None:
        for item in group:
            item.future.set_exception(exc)

    # `prepare` asks for the thread (a replicated leader's group, a node that follows)
    committer = GroupCommitter(
        store,  # type: ignore[arg-type]
        thread,
        lambda group, wb: True,
        committed,
        failed,
        rule=InlineRule(),
    )
    committer.start()
    synced = SyncedWriter(store, thread)  # type: ignore[arg-type]
    waits = []
    for _ in range(10):
        item = _Item()
        committer.submit(item)
        waits += [item.future, synced.write(WriteBatch())]
        await asyncio.sleep(0.005)
    await asyncio.gather(*waits)
    await committer.close()
    await synced.close()
    thread.close()
    kinds = {kind for kind, *_ in store.spans}
    assert kinds == {"group", "synced"}
    assert len({ident for *_, ident in store.spans}) == 1
    spans = sorted(store.spans, key=lambda s: s[1])
    for (k1, _, end, _), (k2, start, _, _) in itertools.pairwise(spans):
        assert start >= end, f"a {k2} write started before a {k1} write's fsync returned"


async def test_jobs_run_in_order_and_their_outcomes_reach_the_loop() -> None:
    thread = StoreThread()
    ran: list[int] = []

    def job(i: int) -> int:
        ran.append(i)
        if i == 3:
            raise OSError(5, "Input/output error")
        return i * 10

    futures = [thread.call(lambda i=i: job(i)) for i in range(5)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    thread.close()
    assert ran == [0, 1, 2, 3, 4]
    assert results[:3] == [0, 10, 20] and results[4] == 40
    assert isinstance(results[3], OSError)


async def test_the_loop_runs_while_a_job_waits_for_the_disk() -> None:
    thread = StoreThread()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.02)

    ticker = asyncio.ensure_future(tick())
    await thread.call(lambda: time.sleep(0.3))
    ticker.cancel()
    thread.close()
    assert ticks >= 5


@pytest.mark.parametrize("jobs", [0, 3])
async def test_close_lets_the_thread_go_after_the_jobs_handed_over(jobs: int) -> None:
    thread = StoreThread(name="closing-writer")
    futures = [thread.call(lambda: time.sleep(0.01)) for _ in range(jobs)]
    thread.close()
    await asyncio.gather(*futures)
    for _ in range(100):
        if not any(t.name == "closing-writer" for t in threading.enumerate()):
            break
        await asyncio.sleep(0.01)
    assert not any(t.name == "closing-writer" for t in threading.enumerate())
