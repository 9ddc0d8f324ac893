"""Open-loop latency rounds taken in turns: every system up at once, one measured at a time.

Systems measured one after another meet different minutes of the machine: a disk still
writing back the previous system's data, a neighbour's burst. Within one run the
rounds of one system spread wider than the differences between systems (Redis
everysec 0.49-1.61 ms p99, streamwal_async 0.46-2.87 ms, in two runs minutes apart), so
which system "won" depended on when it ran. Here round k measures every system in
turn, the order rotated by one each round, so a slow minute lands on all of them and
no system always goes first or last. Each system starts fresh for this phase (its
burst-time behaviour is the separate round right after its produce runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from streamwal.bench import stats
from streamwal.bench import workloads as wl
from streamwal.bench.workloads import Plan, System


def turns(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of each round: every name once, rotated by one per round."""
    n = len(names)
    return [[names[(k + i) % n] for i in range(n)] for k in range(rounds)] if n else []


@contextlib.asynccontextmanager
async def started_afresh(
    systems: Sequence[System],
) -> AsyncIterator[tuple[list[System], dict[str, str]]]:
    """Every system started in a temp dir of its own and all of them up together:
    (started, {name: why it failed to start}); each started one is stopped at the end.

    The systems start concurrently: a start is mostly waiting for a server process to
    answer, and nine of them one after another cost more than the rounds they serve."""
    errors: dict[str, str] = {}

    async def start(system: System, workdir: Path) -> System | None:
        try:
            await system.start(workdir)
        except Exception as err:
            errors[system.name] = f"{type(err).__name__}: {err}"
            with contextlib.suppress(Exception):
                await system.stop()
            return None
        return system

    async def stop(system: System) -> None:
        with contextlib.suppress(Exception):
            await system.stop()

    with contextlib.ExitStack() as dirs:
        workdirs = [
            Path(dirs.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))) for _ in systems
        ]
        outcomes = await asyncio.gather(*map(start, systems, workdirs))
        started = [s for s in outcomes if s is not None]
        try:
            yield started, errors
        finally:
            await asyncio.gather(*map(stop, started))


async def interleaved_latency(
    systems: Sequence[System], plan: Plan, tick: Callable[[str], None]
) -> dict[str, dict]:
    """Per system: `stats.rounds_summary` of its rounds, or {"error": ...} if it failed
    to start or in a round (it then leaves the rotation; the others go on)."""
    by_name = {s.name: s for s in systems}
    rounds: dict[str, list[dict]] = {name: [] for name in by_name}
    async with started_afresh(systems) as (started, errors):
        for k, order in enumerate(turns([s.name for s in started], plan.latency_rounds), 1):
            for name in order:
                if name in errors:
                    tick(f"latency {k}/{plan.latency_rounds} {name} (failed before)")
                    continue
                try:
                    rounds[name].append(await latency_round(by_name[name], f"latency-{k}", plan))
                except Exception as err:
                    errors[name] = f"{type(err).__name__}: {err}"
                tick(f"latency {k}/{plan.latency_rounds} {name}")
    return {
        name: {"error": f"latency rounds: {errors[name]}"}
        if name in errors
        else stats.rounds_summary(rounds[name])
        for name in by_name
    }


async def latency_round(system: System, stream: str, plan: Plan) -> dict:
    """One open-loop latency round on a stream of its own, dropped afterwards."""
    await system.create_stream(stream)
    try:
        return await wl.produce_latency(system, stream, plan)
    finally:
        await system.drop_stream(stream)
