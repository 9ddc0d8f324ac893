"""A node whose wall clock runs an hour ahead (libfaketime in its environment).

Time ticks are hybrid timestamps that only grow per pchannel. A pchannel that a fast node
served carries ticks an hour ahead; when it moves to a correct node, that node's ticks
must stay above them, so their physical part stands still for the hour (issue 22, item 7).
Issue 22's promise, after CockroachDB's --max-offset: a node whose clock differs from the
coord's by more than a bound is refused leadership, with a log line and a metric, and
ticks never freeze for longer than the bound.

The test spreads 1-replica pchannels over three nodes (the third one fast), drains the
fast node (its pchannels move, with their logs, to the correct ones) and checks: the fast
node never led a pchannel, a warning names the clock, and every pchannel's latest tick is
within the bound of the real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import time
from collections.abc import Iterator

import pytest

from streamwal.client.policy import DeliverPolicy
from streamwal.client.wal import open_wal
from streamwal.errors import StreamingError
from streamwal.node.clock import physical_ms
from tests.nemesis import faults
from tests.nemesis.cluster import LeaderWatch
from tests.nemesis.history import Producers
from tests.nemesis.scenarios import GRACE, PROBE
from tests.support import wait_for

FAST = 3
CHANNELS = 6
TICK_BOUND = 60.0  # seconds: ticks ahead of the real time by more than this are frozen
NAMES_CLOCK = re.compile(r"clock|skew|offset", re.IGNORECASE)


@pytest.fixture(autouse=True)
def faketime_shm_removed() -> Iterator[None]:
    """libfaketime 0.9.10 makes a shared-memory object and a semaphore per process in
    /dev/shm and removes them at a clean exit only: the nodes this test SIGKILLs would
    leave theirs behind."""
    pattern = "/dev/shm/*faketime_s[eh]m_*"
    before = set(glob.glob(pattern))
    yield
    for path in set(glob.glob(pattern)) - before:
        with contextlib.suppress(OSError):
            os.unlink(path)


def clock_warnings(*logs) -> list[str]:
    """Warning or error lines of these JSON logs that name the clock."""
    found = []
    for path in logs:
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("level") in ("warning", "error") and NAMES_CLOCK.search(line):
                        found.append(event.get("msg", line)[:200])
    return found


async def latest_tick_ahead(wal, name: str, timeout: float = 10.0) -> float:
    """Seconds by which the newest time tick of `name` is ahead of this machine's clock."""
    consumer = await asyncio.wait_for(
        wal.consumer(name, DeliverPolicy.latest(), time_ticks=True), timeout
    )
    newest = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline or not newest:
            batch = await asyncio.wait_for(consumer.next_batch(), timeout)
            if batch is None:
                break
            newest = max([newest, *(m.time_tick for m in batch)])
    finally:
        await consumer.close()
    return physical_ms(newest) / 1000 - time.time()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_node_clock_an_hour_ahead(nemesis) -> None:
    cluster = nemesis.cluster(
        3,
        node_env={FAST: faults.faketime_env("+1h")},
        grace=GRACE,
        probe_interval=PROBE,
        coord_args=("--max-moves", str(CHANNELS), "--rebalance-interval", "1"),
    )
    await cluster.start()
    names = await cluster.create_channels(CHANNELS, prefix="clk", replicas=1)
    wal = await open_wal(cluster.coord_address, failover_timeout=20)
    watch = LeaderWatch(cluster, names).start()
    work: list[Producers] = []
    try:
        for name in names:
            await wal.resolve(name, timeout=30)
        await cluster.wait_healthy(names)
        work = [Producers(wal, name, count=1, window=4).start() for name in names]
        for w in work:
            await w.wait_acks(50, timeout=30)
        await cluster.drain(FAST)

        async def off_fast() -> bool:
            return all([await cluster.leader(n) not in (None, FAST) for n in names])

        await wait_for(off_fast, 60, 0.2, f"every pchannel off node {FAST}")
        await cluster.drain(FAST, undrain=True)
        for w in work:
            await w.wait_acks(20, timeout=30)
        ahead = {name: await latest_tick_ahead(wal, name) for name in names}
        for w in work:
            await w.stop()
        verdicts = {w.pchannel: await cluster.check(w.pchannel, w.acked) for w in work}

        problems = []
        led = watch.led_by(FAST)
        if led:
            problems.append(f"node {FAST}, an hour ahead, led (pchannel, term) {led}")
        frozen = {n: round(a) for n, a in ahead.items() if abs(a) > TICK_BOUND}
        if frozen:
            problems.append(
                f"ticks ahead of the real time (frozen, or the fast node's), s: {frozen}"
            )
        warned = clock_warnings(cluster.coord_log, cluster.nodes[FAST].log_path)
        if not warned:
            problems.append("no warning names the clock (coord and fast node logs)")
        problems += [f"{n}: {v.summary()[:1000]}" for n, v in verdicts.items() if not v.ok]
        print(
            f"clock +1h on node {FAST}: it led {len(led)} pchannel terms; ticks ahead by "
            f"{ {n: round(a, 1) for n, a in ahead.items()} } s; warnings {warned[:3]}"
        )
        assert not problems, "\n".join(problems)
    finally:
        await watch.stop()
        for w in work:
            with contextlib.suppress(StreamingError, TimeoutError):
                await asyncio.wait_for(w.stop(), 30)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(wal.close(), 10)
