"""`streamwal bench spark`: the PySpark data source's read and write throughput.

A real node and a local[2] Spark session, warmed by untimed runs of each (the JVM keeps
compiling Spark's row conversion over the first runs). Read: N messages
over two pchannels are counted through `spark.read.format("streamwal")`. Write: a
DataFrame of N rows (payload + pchannel, made in the JVM) is saved through
`df.write.format("streamwal")` into two other pchannels. Each run is timed end to end
(planning included), and the CPU time each process spent in it is read from /proc: on a
machine shared with other work the rate moves with the load, CPU per message much less.
Progress on stderr, one JSON object last.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from streamwal.testing.local_node import LocalNode

PCHANNELS = ("bench_0", "bench_1")
SINK_PCHANNELS = ("sink_0", "sink_1")
T = TypeVar("T")


def _processes() -> dict[int, tuple[int, str, float]]:
    """{pid: (parent, command line, CPU seconds of it and its waited-for children)}."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
        out[int(entry)] = (int(fields[1]), cmdline, cpu)
    return out


def cpu_by_role(node_pid: int) -> dict[str, float]:
    """CPU seconds so far of this process's descendants by role: the JVM, PySpark's Python
    workers (daemons and the workers they fork), the node; this process is `driver`."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in procs.items():
        children.setdefault(parent, []).append(pid)
    roles = {"driver": sum(os.times()[:2]), "jvm": 0.0, "python_workers": 0.0, "node": 0.0}
    stack = list(children.get(os.getpid(), ()))
    while stack:
        pid = stack.pop()
        _, cmdline, cpu = procs[pid]
        if pid == node_pid:
            roles["node"] += cpu
            continue  # its children are in its waited-for time
        program = cmdline.split(" ")[0]
        if program.endswith("/java"):
            roles["jvm"] += cpu
        elif "python" in program and "pyspark" in cmdline:
            roles["python_workers"] += cpu
        stack += children.get(pid, ())
    return roles


def timed(
    what: str,
    runs: int,
    messages: int,
    node_pid: int,
    job: Callable[[], T],
    moved: Callable[[T], int],
) -> dict[str, object]:
    """Run `job` `runs` times: rates and CPU per message. `moved(what job returned)`
    counts the messages the run moved, after the clock stopped."""
    rates, cpu = [], []
    for run in range(runs):
        before = cpu_by_role(node_pid)
        started = time.perf_counter()
        done = job()
        elapsed = time.perf_counter() - started
        after = cpu_by_role(node_pid)
        if moved(done) != messages:
            raise click.ClickException(f"{what}: {moved(done)} messages moved, {messages} expected")
        rates.append(round(messages / elapsed))
        cpu.append({role: round((after[role] - before[role]) / messages * 1e6, 3)
                    for role in after})  # fmt: skip
        click.echo(f"{what} run {run}: {rates[-1]:,} msg/s, CPU µs/msg {cpu[-1]}", err=True)
    best = max(range(runs), key=rates.__getitem__)
    return {
        f"{what}_msgs_per_s": rates[best],
        f"{what}_runs_msgs_per_s": rates,
        f"{what}_cpu_us_per_msg": cpu[best],
    }


@click.command("spark")
@click.option("--messages", default=1_000_000, show_default=True, help="Messages per run.")
@click.option("--size", default=128, show_default=True, help="Payload bytes.")
@click.option("--runs", default=3, show_default=True, help="Timed runs after the warm-up.")
@click.option(
    "--warm-up", default=2, show_default=True, help="Untimed runs first (JIT, Python workers)."
)
@click.option(
    "--mode",
    type=click.Choice(["read", "write", "both"]),
    default="both",
    show_default=True,
    help="Read into a count, write a DataFrame, or both.",
)
def spark(messages: int, size: int, runs: int, warm_up: int, mode: str) -> None:
    """Benchmark the Spark data source: messages/s and CPU per message, read and write."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from streamwal.client.policy import DeliverPolicy
    from streamwal.client.sync import SyncNodeClient

    result: dict = {
        "messages": messages,
        "warm_up_runs": warm_up,
        "payload_bytes": size,
        "pchannels": len(PCHANNELS),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="streamwal-bench-spark-") as tmp:
        node = LocalNode(Path(tmp) / "node", extra_args=("--log-level", "warning")).start()
        # The JVM first: forking it while this process's gRPC threads run is what gRPC
        # warns about (and once here the JVM died before it started).
        session = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        client = SyncNodeClient(node.address)
        try:
            payload = b"x" * size
            per = messages // len(PCHANNELS)
            for name in PCHANNELS + SINK_PCHANNELS:
                client.assign(name, 1)
            if mode != "write":
                for name in PCHANNELS:
                    with client.producer(name, 1) as producer:
                        for start in range(0, per, 5000):
                            producer.send_many([payload] * min(5000, per - start))
            node_pid = node.proc.pid
            if mode != "write":
                df = (
                    session.read.format("streamwal")
                    .option("nodes", node.address)
                    .option("pchannelPattern", "bench_.*")
                    .load()
                )
                for _ in range(warm_up):  # Python workers started, the JVM's code compiled
                    df.count()
                result.update(
                    timed("read", runs, per * len(PCHANNELS), node_pid, df.count, lambda n: n)
                )
            if mode != "read":
                to = F.when(F.col("id") % 2 == 0, SINK_PCHANNELS[0]).otherwise(SINK_PCHANNELS[1])
                rows = session.range(0, messages, numPartitions=2).select(
                    F.lit(payload).alias("payload"), to.alias("pchannel")
                )
                writer = rows.write.format("streamwal").option("nodes", node.address)

                def log_ends() -> dict[str, int]:
                    channels = client.collect_status().channels
                    return {c.pchannel.name: c.next_offset for c in channels}

                def written(start: dict[str, int], end: dict[str, int]) -> int:
                    """Messages (idle time ticks aside) appended between two log ends."""
                    n = 0
                    for p in SINK_PCHANNELS:
                        consumer = client.consumer(
                            p, 1, DeliverPolicy.start_from(start[p]), time_ticks=False,
                            end_offset=end[p],
                        )  # fmt: skip
                        while (batch := consumer.next_batch()) is not None:
                            n += len(batch)
                        consumer.close()
                    return n

                def write() -> dict[str, int]:
                    before = log_ends()
                    writer.mode("append").save()
                    return before

                for _ in range(warm_up):
                    writer.mode("append").save()
                result.update(
                    timed("write", runs, messages, node_pid, write,
                          lambda before: written(before, log_ends()))
                )  # fmt: skip
        finally:
            client.close()
            session.stop()
            node.kill()
    click.echo(json.dumps(result))
