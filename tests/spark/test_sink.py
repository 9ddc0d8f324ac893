"""The sink: rows written with df.write / writeStream come back unchanged, once, also
when a task fails after part of its rows were acknowledged and is retried."""

from __future__ import annotations

import gc
import logging
import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from streamwal.client.sync import SyncNodeClient
from streamwal.spark.options import DiscoveryConfig, SinkOptions
from streamwal.spark.sink import run_write
from tests.spark.helpers import assign, produce


def read_back(spark, address: str, pattern: str):
    return (
        spark.read.format("streamwal")
        .option("nodes", address)
        .option("pchannelPattern", pattern)
        .load()
        .collect()
    )


def test_batch_write_round_trips(spark, start_node):
    node = start_node("n1")
    assign(node.address, 1, "sk_0", "sk_1")
    df = spark.range(3000).select(
        F.concat(F.lit("sk_"), (F.col("id") % 2).cast("string"), F.lit("_v7")).alias("vchannel"),
        F.col("id").cast("string").cast("binary").alias("payload"),
        F.create_map(F.lit("n"), F.col("id").cast("string")).alias("properties"),
    )
    df.write.format("streamwal").option("nodes", node.address).mode("append").save()
    rows = read_back(spark, node.address, "sk_.*")
    assert len(rows) == 3000
    for r in rows:
        n = int(r.payload)
        assert (r.pchannel, r.vchannel, r.properties) == (
            f"sk_{n % 2}", f"sk_{n % 2}_v7", {"n": str(n)},
        )  # fmt: skip
    assert sorted(int(r.payload) for r in rows) == list(range(3000))


def appended(address: str, pchannel: str) -> int:
    """Messages (time ticks aside) the node holds in `pchannel`."""
    with SyncNodeClient(address) as c:
        end = {ch.pchannel.name: ch.next_offset for ch in c.collect_status().channels}[pchannel]
        return sum(1 for _ in c.consumer(pchannel, 1, end_offset=end, time_ticks=False))


def test_a_retried_task_does_not_duplicate_what_its_first_attempt_appended(start_node, caplog):
    """The task body (sink.run_write) run twice under one write id, as Spark retries a
    task: the first attempt dies after the node acknowledged two of its batches.

    Driven directly: inside Spark, rows reach the writer in large Arrow batches, so an
    injected failure could not be placed after a first attempt's acknowledged batches.
    """
    node = start_node("n1")
    assign(node.address, 1, "sk_retry")
    opts = SinkOptions(DiscoveryConfig(nodes=(node.address,)), pchannel="sk_retry",
                       columns=("payload",))  # fmt: skip

    def rows(fail_at: int | None):
        """Arrow batches of 100 rows, as Spark hands them to the writer."""
        for lo in range(0, 4000, 100):
            if lo == fail_at:
                deadline = time.monotonic() + 30
                while appended(node.address, "sk_retry") < 2000:
                    assert time.monotonic() < deadline, "first batches never acknowledged"
                    time.sleep(0.05)
                raise RuntimeError("injected task failure")
            yield pa.RecordBatch.from_pydict({"payload": [b"%d" % i for i in range(lo, lo + 100)]})

    with pytest.raises(RuntimeError, match="injected"):
        run_write(opts, "w1", rows(fail_at=2500))
    assert appended(node.address, "sk_retry") >= 2000
    # The failed attempt left no producer behind: its stream's tasks ended with it, not
    # "destroyed but pending" in a Spark worker's log once its loop was gone.
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert "destroyed but it is pending" not in caplog.text
    commit = run_write(opts, "w1", rows(fail_at=None))
    assert commit.skipped["sk_retry"] >= 2000  # what the first attempt had appended
    assert commit.skipped["sk_retry"] + commit.appended["sk_retry"] == 4000
    with SyncNodeClient(node.address) as c:
        end = {ch.pchannel.name: ch.next_offset for ch in c.collect_status().channels}["sk_retry"]
        got = [int(m.payload) for m in c.consumer("sk_retry", 1, end_offset=end, time_ticks=False)]
    assert got == list(range(4000)), "lost or duplicated rows across the retry"


def test_write_stream_pipes_one_pchannel_into_another(spark, start_node, tmp_path):
    node = start_node("n1")
    assign(node.address, 1, "src_0", "dst_0")
    produced = produce(node.address, "src_0", 1500, vchannel="src_0_a", properties={"x": "1"})
    for _ in range(2):  # the second run reads nothing new and must write nothing
        query = (
            spark.readStream.format("streamwal")
            .option("nodes", node.address)
            .option("pchannels", "src_0")
            .option("startingOffsets", "earliest")
            .load()
            .select("payload", "properties")
            .writeStream.format("streamwal")
            .option("nodes", node.address)
            .option("pchannel", "dst_0")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
    rows = read_back(spark, node.address, "dst_0")
    assert sorted(r.payload for r in rows) == sorted(produced.values())
    assert all(r.properties == {"x": "1"} for r in rows)
