"""Runs every workload against one system and folds the results into its report entry."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from streamwal.bench import stats
from streamwal.bench import workloads as wl
from streamwal.bench.workloads import Plan, System


def steps(plan: Plan) -> int:
    """Progress steps per system: produce runs, the after-burst latency round, load,
    catch-up, e2e, and its share of the interleaved latency rounds."""
    return len(plan.payload_sizes) * len(plan.producer_counts) + 4 + plan.latency_rounds


def produce_key(size: int, producers: int) -> str:
    return f"{size}B_x{producers}"


def _tput_stream(size: int, producers: int) -> str:
    return f"tput-{size}-{producers}"


def stream_names(plan: Plan) -> list[str]:
    """The streams a system's run creates, one per workload, in the order it does."""
    tput = [_tput_stream(s, p) for s in plan.payload_sizes for p in plan.producer_counts]
    first = ["latency-1"] if plan.latency_rounds == 1 else []
    return [*first, *tput, "after-burst", "catchup", "e2e"]


async def run_system(
    system: System, plan: Plan, tick: Callable[[str], None], workdir: Path | None = None
) -> dict:
    """Starts `system` in a fresh temp dir, runs the workloads, always stops it."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{system.name}-", dir=workdir) as tmp:
        await system.start(Path(tmp))
        try:
            return await _workloads(system, plan, tick)
        finally:
            await system.stop()


async def _fresh(system: System, stream: str) -> str:
    await system.create_stream(stream)
    return stream


async def _workloads(system: System, plan: Plan, tick: Callable[[str], None]) -> dict:
    # A system whose streams take a wait of their own to create makes them all at once,
    # before the first workload (peer_nats.NatsCluster: each elects its replicas' leader).
    prepare = getattr(system, "prepare_streams", None)
    if prepare is not None:
        await prepare(stream_names(plan))
    # One latency round has nothing to rotate (bench/interleaved.py): it runs here, on the
    # fresh system before its bursts, instead of on a second instance started for it.
    headline = None
    if plan.latency_rounds == 1:
        stream = await _fresh(system, "latency-1")
        headline = stats.rounds_summary([await wl.produce_latency(system, stream, plan)])
        await system.drop_stream(stream)
        tick(f"latency 1/1 {system.name}")

    produce = await bursts(system, plan, tick)

    # Right after the bursts, while the system digests them (compactions, AOF rewrites);
    # the headline latency comes from the interleaved rounds (bench/interleaved.py).
    stream = await _fresh(system, "after-burst")
    after_burst = await wl.produce_latency(system, stream, plan)
    await system.drop_stream(stream)
    tick(f"{system.name} latency after the bursts")

    stream = await _fresh(system, "catchup")
    loaded = await wl.load(system, stream, plan.consume_count, plan.load_seconds)
    tick(f"{system.name} load {loaded}")
    consume = await wl.catch_up(system, stream, loaded, plan)
    await system.drop_stream(stream)
    tick(f"{system.name} catch-up")

    stream = await _fresh(system, "e2e")
    e2e = await wl.end_to_end(system, stream, plan)
    await system.drop_stream(stream)
    tick(f"{system.name} e2e")
    entry = summarize(system.durability, produce, after_burst, consume, e2e)
    if headline is not None:
        with_latency(entry, headline)
    return entry


async def bursts(system: System, plan: Plan, tick: Callable[[str], None]) -> dict[str, dict]:
    """The acknowledged-produce runs, each size and producer count on a stream of its own:
    their results by `produce_key`. What they leave behind (memtables to flush, level-0
    files to compact) is what the after-burst round meets (bench/after_burst.py)."""
    produce: dict[str, dict] = {}
    for size in plan.payload_sizes:
        for producers in plan.producer_counts:
            key = produce_key(size, producers)
            stream = await _fresh(system, _tput_stream(size, producers))
            produce[key] = await wl.produce_throughput(system, stream, plan, size, producers)
            await system.drop_stream(stream)
            tick(f"{system.name} produce {key}")
    return produce


def summarize(
    durability: str, produce: dict[str, dict], after_burst: dict, consume: dict, e2e: dict
) -> dict:
    """The report entry without its headline latency (`with_latency` adds it): headline
    numbers first, the detail of each workload after."""
    small = min(int(k.split("B_")[0]) for k in produce)
    best_small = max(v["msgs_per_s"] for k, v in produce.items() if k.startswith(f"{small}B_"))
    return {
        "produce_msgs_per_s": best_small,
        "produce_after_burst_p99_ms": after_burst["p99_ms"],
        "consume_msgs_per_s": consume["msgs_per_s"],
        "e2e_p50_ms": e2e["p50_ms"],
        "e2e_p99_ms": e2e["p99_ms"],
        "durability": durability,
        "produce": produce,
        "latency_after_burst": after_burst,
        "consume": consume,
        "e2e": e2e,
    }


def with_latency(entry: dict, latency: dict) -> None:
    """Adds the interleaved rounds' summary (`stats.rounds_summary`) as the headline
    latency of `entry`, or its error."""
    if "error" in latency:
        entry["error"] = latency["error"]
        return
    entry.update(
        produce_p50_ms=latency["p50_ms"],
        produce_p99_ms=latency["p99_ms"],
        produce_p999_ms=latency["p999_ms"],
        produce_p99_worst_ms=latency["p99_worst_ms"],
        latency=latency,
    )
