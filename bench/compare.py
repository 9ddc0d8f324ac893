"""`streamwal bench compare`: streamwal, Redis Streams, NATS JetStream and the ceiling,
each started here on loopback and measured by the same workloads in one run.

Prints a table, writes a PNG plot, and prints one JSON object last (for scripts and CI).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
from tqdm import tqdm

from streamwal.bench import ceiling, failover, report, stats
from streamwal.bench.interleaved import interleaved_latency
from streamwal.bench.runner import produce_key, run_system, steps, with_latency
from streamwal.bench.workloads import Plan, System

PEERS = (
    "streamwal",
    "streamwal_async",
    "streamwal_r3",
    "redis",
    "redis_always",
    "redis_r3",
    "nats",
    "nats_r3",
)
# The replicated run is compared with the replicated peers only.
REPLICATED = {"streamwal_r3": ("redis_r3", "nats_r3")}
FAILOVER_KILLS = {"full": 5, "quick": 2, "smoke": 1}


def make_systems(only: tuple[str, ...]) -> list[System]:
    from streamwal.bench.peer_nats import NatsCluster, NatsJetStream
    from streamwal.bench.peer_redis import RedisReplicated, RedisStreams
    from streamwal.bench.sys_streamwal import Streamwal

    made = {
        "streamwal": Streamwal,
        # Redis everysec's and this NATS's durability class: acked once the OS has it; and
        # their delivery guarantee: a batch resent after a lost ack may be stored twice.
        "streamwal_async": lambda: Streamwal("async", idempotent=False),
        "streamwal_r3": lambda: Streamwal(replicas=3),
        "redis": RedisStreams,
        "redis_always": lambda: RedisStreams("always"),
        "redis_r3": RedisReplicated,
        "nats": NatsJetStream,
        "nats_r3": NatsCluster,
    }
    return [made[n]() for n in PEERS if not only or n in only]


def rocks_suite(plan: Plan, tick: Callable[[str], None]) -> dict[str, dict]:
    """Raw rocksdict writes (per produce workload, and one key per message) and the
    catch-up read, each in a fresh DB."""
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rocksdict-") as tmp:
        root = Path(tmp)
        for size in plan.payload_sizes:
            for producers in plan.producer_counts:
                key = produce_key(size, producers)
                out[f"write_{key}"] = ceiling.rocks_write(
                    root / key,
                    plan.produce_count,
                    size,
                    stats.batch_size(size),
                    per_message_keys=False,
                    seconds=plan.produce_seconds,
                    records_per_sync=producers * plan.window,
                )
                tick(f"rocksdict writes {key}")
        small = min(plan.payload_sizes)
        out[f"write_key_per_message_{small}B"] = ceiling.rocks_write(
            root / "keys",
            plan.produce_count,
            small,
            stats.batch_size(small),
            per_message_keys=True,
            seconds=plan.produce_seconds,
        )
        tick("rocksdict key-per-message writes")
        ceiling.rocks_write(
            root / "read",
            plan.consume_count,
            small,
            stats.batch_size(small),
            per_message_keys=False,
            seconds=plan.load_seconds,
            records_per_sync=8,
        )
        out[f"read_record_{small}B"] = ceiling.rocks_read(
            root / "read", per_message_keys=False, seconds=plan.consume_seconds
        )
        tick("rocksdict catch-up read")
    return out


def rocks_steps(plan: Plan) -> int:
    return len(plan.payload_sizes) * len(plan.producer_counts) + 2


async def run_compare(
    plan: Plan, only: tuple[str, ...], tick: Callable[[str], None], kills: int = 0
) -> tuple[dict, dict[str, float]]:
    """Every system in turn (one at a time: they share the machine), then the ceiling,
    then the latency rounds of all of them interleaved; with `kills`, the replicated
    entry also gets its failover unavailability window. Returns the entries and the wall
    seconds each part took."""
    systems: dict[str, dict] = {}
    took: dict[str, float] = {}  # wall seconds of each part: where a run's time goes
    for system in make_systems(only):
        began = time.monotonic()
        try:
            systems[system.name] = await run_system(system, plan, tick)
        except ModuleNotFoundError as err:  # streamwal's client not built yet
            systems[system.name] = {
                "error": f"not available: {err}",
                "durability": system.durability,
            }
        except Exception as err:
            systems[system.name] = {
                "error": f"{type(err).__name__}: {err}",
                "durability": system.durability,
            }
        took[system.name] = time.monotonic() - began
    if kills and "error" not in systems.get("streamwal_r3", {"error": ""}):
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            fo = await failover.failover_windows(Path(tmp), kills, tick)
        systems["streamwal_r3"]["failover"] = fo
        systems["streamwal_r3"]["failover_median_s"] = fo["median_s"]
        systems["streamwal_r3"]["failover_max_s"] = fo["max_s"]
        took["failover"] = time.monotonic() - began
    noop = None
    if not only or "ceiling" in only:
        began = time.monotonic()
        noop = await run_system(ceiling.NoopGrpc(), plan, tick)
        took["ceiling"] = time.monotonic() - began
    # The headline latency: fresh instances of every system that ran, measured in turns
    # (one round only: each system's run measured it first, bench/runner.py).
    entries = {n: e for n, e in systems.items() if "error" not in e}
    measured: list[System] = [s for s in make_systems(only) if s.name in entries]
    if noop is not None:
        measured.append(ceiling.NoopGrpc())
        entries[ceiling.NoopGrpc.name] = noop
    if plan.latency_rounds > 1:
        began = time.monotonic()
        for name, latency in (await interleaved_latency(measured, plan, tick)).items():
            with_latency(entries[name], latency)
        took["interleaved latency"] = time.monotonic() - began
    if noop is not None:
        began = time.monotonic()
        rocks = await asyncio.to_thread(rocks_suite, plan, tick)
        took["rocksdict"] = time.monotonic() - began
        systems["ceiling"] = (
            {"error": noop["error"], "durability": noop["durability"]}
            if "error" in noop
            else report.ceiling_entry(noop, rocks)
        )
    for subject in ("streamwal", "streamwal_async", *REPLICATED):
        vs = report.ratios(systems, subject, REPLICATED.get(subject))
        if vs:
            systems[subject]["vs"] = vs
    return systems, {part: round(seconds, 1) for part, seconds in took.items()}


def _plan_name(quick: bool, smoke: bool) -> str:
    return "smoke" if smoke else "quick" if quick else "full"


@click.command("compare")
@click.option("--quick", is_flag=True, help="Small counts: under a minute (CI smoke use).")
@click.option("--smoke", is_flag=True, hidden=True, help="Even smaller: for the test suite.")
@report.out_option("the systems' throughput and latency")
@click.option(
    "--only",
    multiple=True,
    type=click.Choice([*PEERS, "ceiling"]),
    help="Run only these systems (repeatable).",
)
def compare(quick: bool, smoke: bool, out: str | None, only: tuple[str, ...]) -> None:
    """Side-by-side benchmark of streamwal, Redis Streams, NATS JetStream and the ceiling.

    Each system is started here on loopback with its durability stated next to its
    numbers; the same workloads run against each. Prints a table, writes a plot, and
    prints one JSON object last.
    """
    import uvloop

    name = _plan_name(quick, smoke)
    plan = Plan.named(name)
    count = len(make_systems(only)) + (1 if not only or "ceiling" in only else 0)
    kills = FAILOVER_KILLS[name] if not only or "streamwal_r3" in only else 0
    total = count * steps(plan) + kills
    total += rocks_steps(plan) if not only or "ceiling" in only else 0
    started = time.time()
    with tqdm(total=total, file=sys.stderr, unit="step", leave=False) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        systems, took = uvloop.run(run_compare(plan, only, tick, kills))
    click.echo(report.table(systems, plan.payload_sizes, plan.producer_counts))
    title = (
        f"streamwal bench compare ({name} plan, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{time.time() - started:.0f} s)"
    )
    plotted = None
    if out is not None and any("error" not in e for e in systems.values()):
        plotted = str(report.plot(systems, Path(out), title))
        click.echo(f"plot: {plotted}")
    failed = [n for n, e in systems.items() if "error" in e and "not available" not in e["error"]]
    click.echo(
        json.dumps(
            {
                "systems": systems,
                "plan": name,
                "plot": plotted,
                "seconds": round(time.time() - started, 1),
                "seconds_by_part": took,
            }
        )
    )
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")
