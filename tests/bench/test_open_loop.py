"""The open-loop workload's own behaviour: when sends fire and what a failed send counts as.

The System here is a stand-in written for the test (the real peers are exercised by
test_compare_quick.py); it only records when each send started and fails some of them.
"""

from __future__ import annotations

import asyncio
import time

import uvloop

from streamwal.bench import workloads as wl


class _Producer:
    def __init__(self, starts: list[float], fail_every: int) -> None:
        self._starts = starts
        self._fail_every = fail_every

    async def send_one(self, payload: bytes) -> None:
        self._starts.append(time.perf_counter())
        n = len(self._starts)  # this send's own number: later sends may start meanwhile
        await asyncio.sleep(0)
        if self._fail_every and n % self._fail_every == 0:
            raise ConnectionError("refused")

    async def close(self) -> None:
        pass


class _System:
    name = "stand-in"

    def __init__(self, fail_every: int = 0) -> None:
        self.starts: list[float] = []
        self._fail_every = fail_every

    async def producer(self, stream: str) -> _Producer:
        return _Producer(self.starts, self._fail_every)


def _plan(rate: float, seconds: float) -> wl.Plan:
    return wl.Plan(produce_count=1, produce_seconds=0.1, latency_rate=rate, latency_seconds=seconds)


def test_sends_start_at_their_due_time_never_before_it():
    late: list[float] = []

    async def send(due: float) -> None:
        late.append(time.perf_counter() - due)

    # on uvloop, as `streamwal bench` runs: its timers are whole milliseconds
    fired = uvloop.run(wl._open_loop(1000.0, 0.5, 5000, send))
    late.sort()
    assert fired == len(late) == 500
    # uvloop's timers fired sends up to 1.3 ms early and 1 ms late; the thread does not
    assert late[0] >= 0 and late[len(late) // 2] < 0.0005


async def test_failed_sends_are_counted_not_dropped():
    result = await wl.produce_latency(_System(fail_every=4), "s", _plan(400.0, 0.5))
    assert result["failed"] == 50 and result["count"] == 150
