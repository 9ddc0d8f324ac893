"""`streamwal bench spark`: read throughput of the PySpark data source into a count.

A real node holds N messages over two pchannels; a local[2] Spark session counts them
through `spark.read.format("streamwal")` (Python workers warmed first). Progress on
stderr, one JSON object last.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click

from streamwal.node.local import LocalNode


@click.command("spark")
@click.option("--messages", default=1_000_000, show_default=True, help="Messages in all.")
@click.option("--size", default=100, show_default=True, help="Payload bytes.")
@click.option("--runs", default=2, show_default=True, help="Timed counts after a warm-up.")
def spark(messages: int, size: int, runs: int) -> None:
    """Benchmark the Spark data source: messages/s into a DataFrame count."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from streamwal.client.sync import SyncNodeClient

    result: dict = {"messages": messages, "payload_bytes": size, "pchannels": 2}
    with tempfile.TemporaryDirectory(prefix="streamwal-bench-spark-") as tmp:
        node = LocalNode(Path(tmp) / "node", extra_args=("--log-level", "warning")).start()
        try:
            client = SyncNodeClient(node.address)
            payload = b"x" * size
            per = messages // 2
            for name in ("bench_0", "bench_1"):
                client.assign(name, 1)
                with client.producer(name, 1) as producer:
                    for start in range(0, per, 5000):
                        producer.send_many([payload] * min(5000, per - start))
            client.close()
            session = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.driver.host", "127.0.0.1")
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
            df = (
                session.read.format("streamwal")
                .option("nodes", node.address)
                .option("pchannelPattern", "bench_.*")
                .load()
            )
            df.limit(10).count()  # start the Python workers
            rates = []
            for run in range(runs):
                started = time.perf_counter()
                count = df.count()
                rate = count / (time.perf_counter() - started)
                rates.append(round(rate))
                click.echo(f"run {run}: {count} rows, {rate:,.0f} msg/s", err=True)
                result["rows"] = count
            result["read_msgs_per_s"] = max(rates)
            result["runs_msgs_per_s"] = rates
            session.stop()
        finally:
            node.kill()
    click.echo(json.dumps(result))
