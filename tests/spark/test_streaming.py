"""Streaming reads: availableNow runs, more data, a restart from the checkpoint — every
message lands in the output exactly once; maxOffsetsPerTrigger bounds each micro-batch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.spark.helpers import assign, produce, status


def run_available_now(spark, address: str, out: Path, checkpoint: Path, **options) -> list:
    reader = (
        spark.readStream.format("streamwal")
        .option("nodes", address)
        .option("pchannelPattern", "st_.*")
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .select("pchannel", "offset", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "availableNow run did not finish"
    assert query.exception() is None
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_available_now_more_data_and_restart_read_each_message_once(spark, start_node, tmp_path):
    node = start_node("n1")
    assign(node.address, 1, "st_0", "st_1")
    produced = {}
    for p in ("st_0", "st_1"):
        produced.update({(p, o): v for o, v in produce(node.address, p, 2000, prefix="a").items()})
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    batches = run_available_now(spark, node.address, out, checkpoint, maxOffsetsPerTrigger="2500")
    assert len(batches) >= 2  # 4000 messages (plus time ticks) in steps of at most 2500 offsets
    assert all(b["numInputRows"] <= 2500 for b in batches)
    first = {(r.pchannel, r.offset): r.payload for r in spark.read.parquet(str(out)).collect()}
    assert first == produced

    for p in ("st_0", "st_1"):
        produced.update({(p, o): v for o, v in produce(node.address, p, 1000, prefix="b").items()})
    assign(node.address, 1, "st_2")  # a pchannel that appears later matches the pattern too
    produced.update({("st_2", o): v for o, v in produce(node.address, "st_2", 300).items()})
    run_available_now(spark, node.address, out, checkpoint)
    run_available_now(spark, node.address, out, checkpoint)  # nothing new: nothing read

    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.pchannel, r.offset) for r in rows]
    assert len(keys) == len(set(keys)), "a message was written twice"
    assert {(r.pchannel, r.offset): r.payload for r in rows} == produced


@pytest.mark.parametrize("fail", [True, False])
def test_checkpoint_behind_retention_fails_or_skips(spark, start_node, tmp_path, fail):
    node = start_node("n1", "--retention-check-interval", "100ms")
    assign(node.address, 1, "st_loss")
    produce(node.address, "st_loss", 500, batch=100)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {"pchannelPattern": "st_loss", "failOnDataLoss": str(fail).lower()}
    run_available_now(spark, node.address, out, checkpoint, **options)
    later = produce(node.address, "st_loss", 3000, batch=100, prefix="later")
    assign(node.address, 1, "st_loss", retention_bytes=16_000)  # drops most of `later`
    deadline = time.monotonic() + 20
    while status(node.address)["st_loss"][0] <= min(later):
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.1)
    if fail:
        with pytest.raises(Exception, match=r"pchannel st_loss: offsets \[\d+, \d+\)"):
            run_available_now(spark, node.address, out, checkpoint, **options)
    else:
        run_available_now(spark, node.address, out, checkpoint, **options)
        offsets = [r.offset for r in spark.read.parquet(str(out)).collect()]
        assert len(offsets) == len(set(offsets))
        assert max(offsets) == max(later)  # read on past the hole, up to the end
        assert len([o for o in offsets if o in later]) < len(later)


def test_min_offsets_per_trigger_holds_small_batches_back(spark, start_node, tmp_path):
    """maxTriggerDelay's release is decided by offsets.delay_trigger (tested on its own);
    here the hold itself, in a running query."""
    node = start_node("n1")
    assign(node.address, 1, "mt_0")
    produce(node.address, "mt_0", 300, prefix="a")
    query = (
        spark.readStream.format("streamwal")
        .option("nodes", node.address)
        .option("pchannels", "mt_0")
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "1000")
        .option("maxTriggerDelay", "1h")
        .load()
        .writeStream.format("memory")
        .queryName("min_trigger")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def rows() -> int:
        assert query.exception() is None
        return spark.sql("select count(*) from min_trigger").first()[0]

    def wait_rows(n: int) -> None:
        deadline = time.monotonic() + 60
        while rows() < n:
            assert time.monotonic() < deadline, f"{rows()} rows, waiting for {n}"
            time.sleep(0.1)

    try:
        wait_rows(300)  # the first micro-batch is never held
        produce(node.address, "mt_0", 300, prefix="b")
        time.sleep(3)  # ~15 triggers
        assert rows() == 300  # 300 new offsets (and some time ticks): below the minimum
        produce(node.address, "mt_0", 800, prefix="c")
        wait_rows(1400)
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 1100]
