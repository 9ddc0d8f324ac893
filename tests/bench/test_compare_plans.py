"""`bench compare --quick` prints the keys the full plan prints: a script reading the JSON
of a quick run (CI) reads a full run's the same way.

The plans differ in counts and durations, and in how the headline latency is made (one
round on the system's own instance in the quick plan, interleaved rounds on fresh
instances in the full one, bench/interleaved.py): that is where their outputs could part.
The systems here are stand-ins written for the test, in memory and instant, so both
plans' structure runs in seconds; the real peers are exercised by test_compare_quick.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from streamwal.bench import ceiling, compare, failover, runner
from streamwal.bench.workloads import Plan


class _Producer:
    def __init__(self, log: list[bytes]) -> None:
        self._log = log

    async def send_batch(self, payloads: list[bytes]) -> None:
        self._log.extend(payloads)
        await asyncio.sleep(0)

    async def send_one(self, payload: bytes) -> None:
        await self.send_batch([payload])

    async def close(self) -> None:
        pass


class _Reader:
    def __init__(self, log: list[bytes], batch: int) -> None:
        self._log = log
        self._batch = batch
        self._next = 0

    async def next_batch(self, timeout: float) -> list[bytes]:
        if self._next == len(self._log):
            await asyncio.sleep(min(timeout, 0.001))
        got = self._log[self._next : self._next + self._batch]
        self._next += len(got)
        return got

    async def close(self) -> None:
        pass


class _InMemory:
    """A System whose streams are lists: every send is acknowledged at once."""

    durability = "none: a list in the test's memory"
    server_pid = 0

    def __init__(self, name: str) -> None:
        self.name = name
        self._streams: dict[str, list[bytes]] = {}
        self.prepared: list[str] = []
        self.created: list[str] = []

    async def start(self, workdir: Path) -> None:
        pass

    async def stop(self) -> None:
        self._streams.clear()

    async def prepare_streams(self, streams: list[str]) -> None:
        self.prepared += streams

    async def create_stream(self, stream: str) -> None:
        self.created.append(stream)
        self._streams[stream] = []

    async def drop_stream(self, stream: str) -> None:
        self._streams.pop(stream, None)

    async def producer(self, stream: str) -> _Producer:
        return _Producer(self._streams[stream])

    async def reader(self, stream: str, batch: int) -> _Reader:
        return _Reader(self._streams[stream], batch)


class _Ceiling(_InMemory):
    name = "grpc_noop"

    def __init__(self) -> None:
        super().__init__(self.name)


def _keys(value: object, path: str = "") -> set[str]:
    """Every key path in a JSON value (list items merged: rounds are rounds)."""
    if isinstance(value, dict):
        out = set()
        for key, inner in value.items():
            out |= {f"{path}/{key}"} | _keys(inner, f"{path}/{key}")
        return out
    if isinstance(value, list):
        return set().union(*(_keys(item, f"{path}[]") for item in value))
    return set()


def _shrunk(name: str) -> Plan:
    """The named plan at a test's scale: only its counts and durations change."""
    return dataclasses.replace(
        Plan.named(name),
        produce_count=400,
        produce_seconds=0.02,
        latency_rate=500.0,
        latency_seconds=0.02,
        consume_count=500,
        load_seconds=1.0,
        consume_seconds=1.0,
        e2e_rate=500.0,
        e2e_seconds=0.02,
    )


async def test_the_quick_plan_prints_the_keys_of_the_full_plan(monkeypatch):
    monkeypatch.setattr(compare, "make_systems", lambda only: [_InMemory(n) for n in compare.PEERS])
    monkeypatch.setattr(ceiling, "NoopGrpc", _Ceiling)

    async def windows(workdir: Path, kills: int, tick) -> dict:
        return {"kills": kills, "windows_s": [0.5] * kills, "median_s": 0.5, "max_s": 0.5}

    monkeypatch.setattr(failover, "failover_windows", windows)
    printed = {}
    for name in ("quick", "full"):
        plan = _shrunk(name)
        systems, _ = await compare.run_compare(
            plan, (), lambda _: None, compare.FAILOVER_KILLS[name]
        )
        printed[name] = _keys(systems)
    assert Plan.named("full").latency_rounds > Plan.named("quick").latency_rounds == 1
    assert "/streamwal_r3/vs/produce_x_nats_r3" in printed["quick"]
    assert "/ceiling/rocksdict/read_record_128B/msgs_per_s" in printed["quick"]
    assert printed["quick"] == printed["full"], printed["quick"] ^ printed["full"]


async def test_the_streams_made_ahead_are_the_ones_a_run_creates():
    # peer_nats.NatsCluster creates them all at once before the first workload: a name
    # missing here would be created (and waited for) at its turn, one left over idles
    for name in ("quick", "full"):
        system = _InMemory("stand-in")
        await runner.run_system(system, _shrunk(name), lambda _: None)
        assert system.created == system.prepared == runner.stream_names(_shrunk(name))
