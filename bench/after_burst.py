"""`streamwal bench after-burst`: `bench compare`'s after-burst case alone, for streamwal
(one node, sync durability), several times, with what RocksDB did during each round.

Why: the p99 right after the bursts is bimodal (issue 20). It depends on whether a
memtable flush or a compaction the bursts left behind runs during the open-loop round,
and on what else writes to the disk meanwhile; one `bench compare` run gives one sample
of it. This runs the same bursts and round (bench/runner.py, bench/workloads.py) on a
fresh node per run and reports, per run, the round's latencies beside the flushes and
compactions that overlapped it (from the node's RocksDB LOG) and the 1-minute load, so
a change can be judged on a distribution, and on runs that met the same background work.
Progress on stderr, one JSON object last on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

from streamwal.bench import runner
from streamwal.bench import workloads as wl
from streamwal.bench.sys_streamwal import Streamwal

_EVENT = "EVENT_LOG_v1 "


def rocksdb_activity(log_text: str, start_s: float, end_s: float) -> dict:
    """The flushes and compactions of a RocksDB LOG that overlapped [start_s, end_s]
    (wall-clock seconds), and the files deleted in it.

    A job overlaps when it started before the end and had not finished by the start (a
    job still running when the LOG was read has no finish). Sizes: what a flush took
    from its memtables, what a compaction read and wrote; all in MB.
    """
    started: dict[int, dict] = {}
    finished: dict[int, dict] = {}
    deleted = 0
    for line in log_text.splitlines():
        at = line.find(_EVENT)
        if at < 0:
            continue
        try:
            event = json.loads(line[at + len(_EVENT) :])
        except ValueError:
            continue  # a line cut by the process writing it
        kind, seconds = event.get("event", ""), event.get("time_micros", 0) / 1e6
        event["at"] = seconds
        if kind in ("flush_started", "compaction_started"):
            started[event["job"]] = event
        elif kind in ("flush_finished", "compaction_finished"):
            finished[event["job"]] = event
        elif kind == "table_file_deletion" and start_s <= seconds <= end_s:
            deleted += 1
    flushes = compactions = 0
    flush_mb = read_mb = written_mb = 0.0
    for job, begin in started.items():
        end = finished.get(job)
        if begin["at"] > end_s or (end is not None and end["at"] < start_s):
            continue
        if begin["event"] == "flush_started":
            flushes += 1
            flush_mb += begin.get("total_data_size", 0) / 1e6
        else:
            compactions += 1
            read_mb += begin.get("input_data_size", 0) / 1e6
            written_mb += (end or {}).get("total_output_size", 0) / 1e6
    return {
        "flushes": flushes,
        "flush_mb": round(flush_mb, 1),
        "compactions": compactions,
        "compaction_read_mb": round(read_mb, 1),
        "compaction_written_mb": round(written_mb, 1),
        "files_deleted": deleted,
    }


async def one_run(plan: wl.Plan, workdir: Path) -> dict:
    """The bursts, then the round, on a fresh node in `workdir`."""
    system = Streamwal()
    await system.start(workdir)
    try:
        load = os.getloadavg()[0]
        produce = await runner.bursts(system, plan, lambda step: print(step, file=sys.stderr))
        await system.create_stream("after-burst")
        start = time.time()
        round_ = await wl.produce_latency(system, "after-burst", plan)
        end = time.time()
        log = (Streamwal.data_dir(workdir) / "LOG").read_text(errors="replace")
    finally:
        await system.stop()
    return {
        "p50_ms": round(round_["p50_ms"], 3),
        "p99_ms": round(round_["p99_ms"], 3),
        "max_ms": round(round_["max_ms"], 3),
        "failed": round_["failed"],
        "load_average_1m": round(load, 2),
        "produce_msgs_per_s": {key: round(r["msgs_per_s"]) for key, r in produce.items()},
        "rocksdb_in_round": rocksdb_activity(log, start, end),
    }


async def run(plan: wl.Plan, runs: int) -> dict:
    results = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-after-burst-") as tmp:
            results.append(await one_run(plan, Path(tmp)))
        print(f"run {i + 1}/{runs}: p99 {results[-1]['p99_ms']} ms", file=sys.stderr)
    p99s = [r["p99_ms"] for r in results]
    return {
        "system": "streamwal (one node, sync: fsync per group commit)",
        "rate_per_s": plan.latency_rate,
        "seconds": plan.latency_seconds,
        "p99_ms_median": round(statistics.median(p99s), 3),
        "p99_ms_sorted": sorted(p99s),
        "runs": results,
    }


@click.command("after-burst")
@click.option("--quick", is_flag=True, help="bench compare --quick's counts and round.")
@click.option("--smoke", is_flag=True, help="The smallest counts (tests).")
@click.option(
    "--runs",
    type=click.IntRange(1, 100),
    default=6,
    show_default=True,
    help="Runs, each on a fresh node: its bursts, then its round.",
)
def after_burst(quick: bool, smoke: bool, runs: int) -> None:
    """bench compare's after-burst p99 for streamwal alone, RUNS times on a fresh node,
    each with the flushes and compactions that overlapped its round."""
    plan = wl.Plan.named("smoke" if smoke else "quick" if quick else "full")
    print(json.dumps(asyncio.run(run(plan, runs))))
