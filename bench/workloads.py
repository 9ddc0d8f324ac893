"""The workloads, written once against a small `System` protocol every peer implements.

Each system only says how it starts, produces and reads in its own fastest honest way;
timing, rates, open-loop scheduling and percentiles live here, so every system is
measured by the same code. Every loop is bounded by a message count and a deadline.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from streamwal.bench import stats

_STAMP = struct.Struct(">Q")


class Producer(Protocol):
    async def send_batch(self, payloads: list[bytes]) -> None:
        """Appends all payloads and returns once every one is acknowledged."""

    async def send_one(self, payload: bytes) -> None:
        """Appends one payload and returns once it is acknowledged."""

    async def close(self) -> None: ...


class Reader(Protocol):
    async def next_batch(self, timeout: float) -> list[bytes]:
        """The next payloads in order ([] when none came within `timeout` seconds)."""

    async def close(self) -> None: ...


class System(Protocol):
    name: str
    durability: str  # what an acknowledgement means, stated next to the numbers

    async def start(self, workdir: Path) -> None: ...

    async def stop(self) -> None: ...

    async def create_stream(self, stream: str) -> None: ...

    async def drop_stream(self, stream: str) -> None:
        """Frees what the stream holds (memory-resident peers would run out otherwise)."""

    async def producer(self, stream: str) -> Producer:
        """A producer with its own connection (so N producers are N clients)."""

    async def reader(self, stream: str, batch: int) -> Reader:
        """Reads the stream from its first message, then follows its tail."""

    @property
    def server_pid(self) -> int:
        """The process that answers producers, while started (`bench trace`)."""
        ...


@dataclass(frozen=True)
class Plan:
    """How much of each workload to run; `quick` fits a CI smoke run, `full` ~10 min."""

    produce_count: int  # acknowledged-produce runs: messages per run (cap)
    produce_seconds: float  # ... and time per run (cap)
    payload_sizes: tuple[int, ...] = (128, 4096)
    producer_counts: tuple[int, ...] = (1, 4)
    window: int = 2  # produce batches in flight per producer
    latency_rate: float = 1000.0  # open-loop produce rate, messages/s
    latency_seconds: float = 5.0
    latency_rounds: int = 1  # interleaved rounds per system (bench/interleaved.py)
    consume_count: int = 1_000_000
    load_seconds: float = 90.0  # cap on preparing the catch-up stream
    consume_seconds: float = 60.0
    read_batch: int = 1000
    e2e_rate: float = 1000.0
    e2e_seconds: float = 5.0
    max_in_flight: int = 5000  # open-loop sends outstanding before a run is cut short

    @staticmethod
    def named(name: str) -> Plan:
        if name == "full":
            # Worst case (every cap hit) ~115 s per system, ~9.5 min for five; typical ~6 min.
            return Plan(
                produce_count=300_000,
                produce_seconds=5.0,
                latency_seconds=5.0,
                latency_rounds=5,
                load_seconds=40.0,
                consume_seconds=30.0,
                e2e_seconds=5.0,
            )
        if name == "quick":
            # Under a minute for the nine systems of `bench compare`: 51-57 s at load 4-5
            # (docs/benchmarks.md, "Side by side"), ~37 s of it these durations (three
            # 0.7 s open-loop rounds and four produce runs of at most 0.5 s per system),
            # the RF=3 failover's 2 kills 6-10 s; the rest is starting the servers.
            return Plan(
                produce_count=20_000,
                produce_seconds=0.5,
                latency_rate=500.0,
                latency_seconds=0.7,
                consume_count=10_000,
                load_seconds=6.0,
                consume_seconds=6.0,
                e2e_rate=500.0,
                e2e_seconds=0.7,
            )
        if name == "smoke":
            return Plan(
                produce_count=3_000,
                produce_seconds=0.3,
                latency_rate=300.0,
                latency_seconds=0.4,
                consume_count=5_000,
                load_seconds=4.0,
                consume_seconds=4.0,
                e2e_rate=300.0,
                e2e_seconds=0.4,
            )
        raise ValueError(f"unknown plan {name!r} (full, quick, smoke)")


def payload_pool(size: int, distinct: int = 256) -> list[bytes]:
    """Distinct random payloads to cycle through (no system gets free compression)."""
    return [os.urandom(size) for _ in range(distinct)]


def _stamped(size: int, due: float) -> bytes:
    """A payload of `size` bytes whose first 8 carry its due time in ns (same clock)."""
    return _STAMP.pack(int(due * 1e9)) + b"x" * max(0, size - _STAMP.size)


async def produce_throughput(
    system: System, stream: str, plan: Plan, size: int, producers: int
) -> dict[str, float]:
    """Acknowledged produce throughput: `producers` clients, `plan.window` batches each."""
    pool = payload_pool(size)
    per_batch = stats.batch_size(size)
    handles = [await system.producer(stream) for _ in range(producers)]
    deadline = time.perf_counter() + plan.produce_seconds
    acked = 0

    async def lane(handle: Producer, quota: int) -> None:
        nonlocal acked
        sent = 0
        while sent < quota and time.perf_counter() < deadline:
            n = min(per_batch, quota - sent)
            batch = [pool[(sent + i) % len(pool)] for i in range(n)]
            sent += n
            await handle.send_batch(batch)
            acked += n

    quotas = stats.split(plan.produce_count, producers * plan.window)
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(lane(handles[i % producers], q) for i, q in enumerate(quotas)))
        elapsed = time.perf_counter() - t0
    finally:
        for h in handles:
            await h.close()
    msgs = stats.rate(acked, elapsed)
    return {
        "count": acked,
        "seconds": elapsed,
        "msgs_per_s": msgs,
        "mb_per_s": msgs * size / 1e6,
        "batch": per_batch,
    }


async def _open_loop(
    rate_per_s: float, seconds: float, max_in_flight: int, send: Callable[[float], object]
) -> int:
    """Fires `send(due)` at a fixed rate regardless of replies; returns how many fired.

    A thread keeps the schedule, not the event loop's timers: uvloop's are whole
    milliseconds, which fired sends up to 1.3 ms early or 1 ms late, noise larger than
    the latencies measured. The thread's sleep ends within about 0.1 ms of the due time
    and hands the send to the loop, which starts it as soon as it is free; time a client
    library keeps its loop busy still counts against that system.
    """
    loop = asyncio.get_running_loop()
    total = int(rate_per_s * seconds)
    tasks: set[asyncio.Task] = set()
    cut = threading.Event()
    fired = 0

    def fire(due: float) -> None:
        nonlocal fired
        if cut.is_set():
            return
        if len(tasks) >= max_in_flight:
            cut.set()  # the system stopped answering; what was measured is reported
            return
        task = asyncio.ensure_future(send(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        fired += 1

    def keep_schedule() -> None:
        start = time.perf_counter() + 0.01
        for i in range(total):
            due = stats.schedule(start, rate_per_s, i)
            while (delay := due - time.perf_counter()) > 0:
                time.sleep(delay)
            if cut.is_set():
                return
            loop.call_soon_threadsafe(fire, due)

    try:
        await asyncio.to_thread(keep_schedule)
    finally:
        cut.set()  # a cancelled run stops the thread at its next due time
    if tasks:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=max(10.0, seconds))
    return fired


async def produce_latency(
    system: System, stream: str, plan: Plan, size: int = 128
) -> dict[str, float]:
    """Produce latency at a fixed moderate rate, open loop, measured from the due time.

    A send that fails has no latency; it is counted in `failed`, never dropped silently
    (a client that gives up in a stall would otherwise look faster for it).
    """
    handle = await system.producer(stream)
    pool = payload_pool(size)
    latencies: list[float] = []
    failed = 0

    async def send(due: float) -> None:
        nonlocal failed
        try:
            await handle.send_one(pool[(len(latencies) + failed) % len(pool)])
        except Exception:
            failed += 1
            return
        latencies.append(time.perf_counter() - due)

    try:
        await _open_loop(plan.latency_rate, plan.latency_seconds, plan.max_in_flight, send)
    finally:
        await handle.close()
    return {"rate_per_s": plan.latency_rate, "failed": failed, **stats.latency_summary(latencies)}


async def load(system: System, stream: str, count: int, seconds: float, size: int = 128) -> int:
    """Fills a stream for the catch-up run as fast as the system takes it (untimed)."""
    handle = await system.producer(stream)
    pool = payload_pool(size)
    per_batch = stats.batch_size(size)
    deadline = time.perf_counter() + seconds
    loaded = 0

    async def lane(quota: int) -> None:
        nonlocal loaded
        sent = 0
        while sent < quota and time.perf_counter() < deadline:
            n = min(per_batch, quota - sent)
            sent += n
            await handle.send_batch([pool[(loaded + i) % len(pool)] for i in range(n)])
            loaded += n

    try:
        await asyncio.gather(*(lane(q) for q in stats.split(count, 2)))
    finally:
        await handle.close()
    return loaded


async def catch_up(system: System, stream: str, count: int, plan: Plan) -> dict[str, float]:
    """Reads `count` stored messages from the start; timed from opening the reader."""
    t0 = time.perf_counter()
    reader = await system.reader(stream, plan.read_batch)
    deadline = t0 + plan.consume_seconds
    got = 0
    try:
        while got < count and time.perf_counter() < deadline:
            got += len(await reader.next_batch(timeout=min(1.0, deadline - time.perf_counter())))
        elapsed = time.perf_counter() - t0
    finally:
        await reader.close()
    return {
        "count": got,
        "expected": count,
        "seconds": elapsed,
        "msgs_per_s": stats.rate(got, elapsed),
    }


async def end_to_end(system: System, stream: str, plan: Plan, size: int = 128) -> dict[str, float]:
    """Produce -> delivered to a live consumer, open loop, measured from the due time."""
    reader = await system.reader(stream, plan.read_batch)
    handle = await system.producer(stream)
    latencies: list[float] = []
    total = int(plan.e2e_rate * plan.e2e_seconds)
    failed = 0
    done = asyncio.Event()

    async def send(due: float) -> None:
        # As in produce_latency: a failed send is counted, and the run goes on (an
        # exception here used to leave the other sends' exceptions unretrieved).
        nonlocal failed
        try:
            await handle.send_one(_stamped(size, due))
        except Exception:
            failed += 1

    async def follow() -> None:
        while len(latencies) < total:
            batch = await reader.next_batch(timeout=0.5)
            now = time.perf_counter()
            latencies.extend(now - _STAMP.unpack_from(p)[0] / 1e9 for p in batch)
        done.set()

    follower = asyncio.create_task(follow())
    try:
        fired = await _open_loop(plan.e2e_rate, plan.e2e_seconds, plan.max_in_flight, send)
        total = min(total, fired - failed)
        await asyncio.wait_for(done.wait(), timeout=max(10.0, plan.e2e_seconds))
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await handle.close()
        await reader.close()
    return {"rate_per_s": plan.e2e_rate, "failed": failed, **stats.latency_summary(latencies)}
