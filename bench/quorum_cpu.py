"""CPU per acknowledged message on each process of a replicated pchannel, at the shape of
`bench compare`'s streamwal_r3 produce runs: what a shared machine's load moves much less
than the rate (docs/benchmarks.md, "Replicated path").

Three processes and the client share this machine's cores, so a quorum append's rate is
bound by the sum of their CPU per message. Here the leader, each follower and this process
as the client are measured apart: compare's system (node processes started as a user
would, idempotent producers acknowledged at QUORUM) and its produce workload (128-byte
payloads in 512-message batches, 2 in flight per producer), `--rounds` runs per producer
count after one warm-up run. For each run, divided by its acknowledged messages: CPU time
on all of a node's threads and on its event-loop thread alone (/proc/PID/task/*/schedstat,
nanoseconds; Linux only), this process's (`time.process_time`), and the rate for
reference. The last stdout line is one JSON object: per producer count, the median of each
figure over the rounds and every round.

`--open-loop RATE` measures compare's open-loop latency workload instead: one producer
sending one message at a time at RATE a second for `--seconds` (compare's 1,000/s, 5 s),
each send's CPU per process and the round's p50 / p99 (ms), `--rounds` rounds (and the
produce runs too if `--producers` is given): where a one-at-a-time quorum send's CPU goes,
and what it does to the tail.

`--also-follows` gives the measured leader (node 1) a second, idle pchannel to follow,
led by node 2, as in a cluster whose leaders are spread over the nodes: a node that
follows some pchannel writes its own leader groups on its store's writer thread, never
on the loop (decisions-replicated-path.md, "A follower's synced writes never run on its
loop"). Compare puts every leader on node 1, so this is the shape it does not measure.

Usage: python -m streamwal.bench.quorum_cpu [--messages N] [--rounds R] [--replicas N]
       python -m streamwal.bench.quorum_cpu --open-loop 1000 [--seconds S] [--rounds R]
                                            [--also-follows]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import uvloop

from streamwal.bench import workloads as wl
from streamwal.bench.node_cpu import node_cpu
from streamwal.bench.sys_streamwal import Streamwal

STREAM = "quorum-cpu"
FOLLOWED = "quorum-cpu-followed"  # --also-follows: led by node 2, idle
SIZE = 128


async def measure(
    messages: int,
    rounds: int,
    replicas: int,
    producers: tuple[int, ...],
    open_loop: float = 0.0,
    seconds: float = 5.0,
    also_follows: bool = False,
) -> dict:
    system = Streamwal(replicas=replicas)
    out: dict = {
        "replicas": replicas,
        "size": SIZE,
        "durability": "",
        "leader_also_follows": also_follows,
    }
    with tempfile.TemporaryDirectory(prefix="quorum-cpu-") as tmp:
        await system.start(Path(tmp))
        try:
            out["durability"] = system.durability
            await system.create_stream(STREAM)
            if also_follows:
                await system.create_stream(FOLLOWED, leader=1)
            warm = wl.Plan(produce_count=20_000, produce_seconds=2.0)
            await wl.produce_throughput(system, STREAM, warm, SIZE, 1)
            if open_loop:
                plan = wl.Plan(0, 0.0, latency_rate=open_loop, latency_seconds=seconds)
                runs = [await _run_open_loop(system, plan) for _ in range(rounds)]
                out[f"open_loop_{open_loop:g}"] = _summary(runs)
            plan = wl.Plan(produce_count=messages, produce_seconds=30.0)
            for count in producers:
                runs = [await _run(system, plan, count) for _ in range(rounds)]
                out[f"x{count}"] = _summary(runs)
        finally:
            await system.stop()
    return out


def _summary(runs: list[dict[str, float]]) -> dict:
    return {"median": {k: statistics.median(r[k] for r in runs) for k in runs[0]}, "rounds": runs}


async def _run(system: Streamwal, plan: wl.Plan, producers: int) -> dict[str, float]:
    """One produce run: ns of CPU per acknowledged message of each process."""
    return await _cpu(
        system, wl.produce_throughput(system, STREAM, plan, SIZE, producers), "msgs_per_s"
    )


async def _run_open_loop(system: Streamwal, plan: wl.Plan) -> dict[str, float]:
    """One open-loop round: ns of CPU per acknowledged send of each process, and its tail."""
    return await _cpu(system, wl.produce_latency(system, STREAM, plan, SIZE), "p50_ms", "p99_ms")


async def _cpu(system: Streamwal, workload, *keep: str) -> dict[str, float]:
    """Run `workload` (its result counts acknowledged messages in `count`): its `keep`
    figures, and each process's CPU per acknowledged message (ns)."""
    pids = system.pids
    before = [node_cpu(pid) for pid in pids]
    client = time.process_time()
    result = await workload
    client = time.process_time() - client
    after = [node_cpu(pid) for pid in pids]
    n = result["count"]
    row = {k: round(result[k], 3) for k in keep}
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        name = "leader" if i == 0 else f"follower{i}"
        row[f"{name}_ns"] = round((a[0] - b[0]) / n * 1e9)
        row[f"{name}_loop_ns"] = round((a[1] - b[1]) / n * 1e9)
    row["client_ns"] = round(client / n * 1e9)
    row["total_ns"] = sum(v for k, v in row.items() if k.endswith("_ns") and "_loop" not in k)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=300_000, help="Messages of each produce run."
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="Produce runs per producer count (median)."
    )
    parser.add_argument(
        "--replicas", type=int, default=3, help="Node processes holding the pchannel (odd, > 1)."
    )
    parser.add_argument(
        "--producers",
        type=int,
        nargs="+",
        default=None,
        help="Producer counts to run, each a client of its own (default: compare's x1 and "
        "x4, none with --open-loop).",
    )
    parser.add_argument(
        "--open-loop",
        type=float,
        default=0.0,
        metavar="RATE",
        help="Measure one-at-a-time sends at RATE a second instead (compare's open loop).",
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="Length of each --open-loop round."
    )
    parser.add_argument(
        "--also-follows",
        action="store_true",
        help="The measured leader also follows an idle pchannel led by node 2 (leaders "
        "spread over the nodes, as in a cluster).",
    )
    args = parser.parse_args()
    if args.producers is None:
        args.producers = [] if args.open_loop else [1, 4]
    if args.replicas < 3 or args.replicas % 2 == 0:
        parser.error(f"--replicas must be odd and at least 3, got {args.replicas}")
    if args.messages < 1 or args.rounds < 1 or min(args.producers, default=1) < 1:
        parser.error("--messages, --rounds and --producers must be at least 1")
    if args.open_loop < 0 or args.seconds <= 0:
        parser.error("--open-loop must not be negative and --seconds must be positive")
    result = uvloop.run(
        measure(
            args.messages,
            args.rounds,
            args.replicas,
            tuple(args.producers),
            args.open_loop,
            args.seconds,
            args.also_follows,
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
