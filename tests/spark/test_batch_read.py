"""Batch reads through `spark.read.format("streamwal")` against real nodes: what comes out
is exactly what was produced, for each way of naming offsets, and data loss is handled
as asked."""

from __future__ import annotations

import json
import re
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql.utils import AnalysisException

from streamwal.client.policy import DeliverPolicy
from streamwal.client.sync import SyncNodeClient
from streamwal.message import MsgType
from tests.spark.helpers import assign, produce, status


def rows_by_key(df) -> dict[tuple[str, int], tuple]:
    out = {}
    for r in df.collect():
        key = (r.pchannel, r.offset)
        assert key not in out, f"duplicate row {key}"
        out[key] = r
    return out


@pytest.fixture(scope="module")
def two_pchannels(module_nodes):
    node = module_nodes("n1")
    assign(node.address, 1, "ra_0", "ra_1")
    produced = {
        "ra_0": produce(node.address, "ra_0", 1200, vchannel="ra_0_v1", properties={"k": "a"}),
        "ra_1": produce(node.address, "ra_1", 700, vchannel="ra_1_v2", msg_type=MsgType.Delete),
    }
    return node, produced


def read(spark, node, **options):
    reader = spark.read.format("streamwal").option("nodes", node.address)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_earliest_to_latest_returns_every_message_with_its_fields(spark, two_pchannels):
    node, produced = two_pchannels
    t0_ms = time.time() * 1000
    rows = rows_by_key(
        read(spark, node, pchannelPattern="ra_.*", maxOffsetsPerPartition="300", minPartitions="4")
    )
    expected = {(p, o): v for p, msgs in produced.items() for o, v in msgs.items()}
    assert set(rows) == set(expected)  # no time ticks unless asked, nothing missing
    for key, payload in expected.items():
        assert rows[key].payload == payload
    r0 = rows[("ra_0", min(produced["ra_0"]))]
    assert (r0.vchannel, r0.message_type, r0.properties, r0.term) == (
        "ra_0_v1", int(MsgType.Insert), {"k": "a"}, 1,
    )  # fmt: skip
    r1 = rows[("ra_1", max(produced["ra_1"]))]
    assert (r1.vchannel, r1.message_type, r1.properties) == ("ra_1_v2", int(MsgType.Delete), {})
    # the timestamp is the physical part of the time tick (ms), i.e. wall-clock time
    assert r1.timestamp.timestamp() * 1000 == pytest.approx(t0_ms, abs=120_000)
    assert int(r1.timestamp.timestamp() * 1000) == r1.time_tick >> 18


def test_json_offsets_select_exact_ranges(spark, two_pchannels):
    node, produced = two_pchannels
    o0 = sorted(produced["ra_0"])
    o1 = sorted(produced["ra_1"])
    start = {"ra_0": o0[100], "ra_1": -2}
    end = {"ra_0": o0[900], "ra_1": -1}
    rows = rows_by_key(
        read(spark, node, pchannels="ra_0,ra_1", startingOffsets=json.dumps(start),
             endingOffsets=json.dumps(end))
    )  # fmt: skip
    want = {("ra_0", o) for o in o0[100:900]} | {("ra_1", o) for o in o1}
    assert set(rows) == want


def test_only_named_pchannels_and_pchannels_missing_from_json_default(spark, two_pchannels):
    node, produced = two_pchannels
    o1 = sorted(produced["ra_1"])
    # ra_0 is not selected; ra_1 starts at a given offset and ends at latest (default)
    rows = rows_by_key(
        read(spark, node, pchannels="ra_1", startingOffsets=json.dumps({"ra_1": o1[-10]}))
    )
    assert set(rows) == {("ra_1", o) for o in o1[-10:]}
    before_first = json.dumps({"ra_1": o1[0]})
    assert read(spark, node, pchannels="ra_1", endingOffsets=before_first).count() == 0


def test_time_ticks_are_rows_only_when_asked(spark, two_pchannels):
    node, produced = two_pchannels
    # The node appends a TimeTick message every 200 ms to an idle pchannel with a reader
    # that takes them: one is held until it got two.
    with (
        SyncNodeClient(node.address) as client,
        client.consumer("ra_0", 1, DeliverPolicy.latest(), time_ticks=True, timeout=10) as reader,
    ):
        # `latest` delivers the newest message first
        assert [next(reader).msg_type for _ in range(3)][1:] == [MsgType.TimeTick] * 2
    with_ticks = read(spark, node, pchannels="ra_0", includeTimeTicks="true")
    ticks = with_ticks.where(f"message_type = {int(MsgType.TimeTick)}").count()
    assert ticks >= 1
    assert with_ticks.count() == len(produced["ra_0"]) + ticks
    assert read(spark, node, pchannels="ra_0").count() == len(produced["ra_0"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pchannels": "a", "startingOffsets": "latest"}, "latest is not allowed"),
        ({"pchannels": "a", "endingOffsets": "earliest"}, "earliest is not allowed"),
        ({"pchannels": "a", "startingOffsets": "{bad"}, "startingOffsets"),
        ({}, "pchannels or pchannelPattern"),
    ],
)
def test_bad_options_fail_with_a_clear_message(spark, two_pchannels, options, message):
    node, _ = two_pchannels
    with pytest.raises((AnalysisException, PySparkException)) as err:
        read(spark, node, **options).collect()
    assert message in str(err.value)


def test_fail_on_data_loss_both_ways(spark, start_node):
    node = start_node("n1", "--retention-check-interval", "100ms")
    assign(node.address, 1, "loss_0")
    produced = produce(node.address, "loss_0", 3000, batch=100)  # 30 records
    # ~3 KB per record: keep the newest few (idle time ticks are tiny records)
    assign(node.address, 1, "loss_0", retention_bytes=16_000)
    deadline = time.monotonic() + 20
    while status(node.address)["loss_0"][0] == 0:
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.1)
    first, _ = status(node.address)["loss_0"]
    spec = json.dumps({"loss_0": 0})

    with pytest.raises(Exception) as err:
        read(spark, node, pchannels="loss_0", startingOffsets=spec).collect()
    text = str(err.value)
    lost = re.search(r"pchannel loss_0: offsets \[0, (\d+)\) are no longer available", text)
    assert lost and int(lost.group(1)) >= first and "failOnDataLoss=false" in text

    rows = rows_by_key(read(spark, node, pchannels="loss_0", startingOffsets=spec,
                            failOnDataLoss="false"))  # fmt: skip
    # idle time ticks keep moving the retention cut; what is still there is read, once
    kept = min(o for _, o in rows)
    assert first <= kept < max(produced)
    assert set(rows) == {("loss_0", o) for o in produced if o >= kept}
    assert max(o for _, o in rows) == max(produced)


def test_timestamps_pick_the_messages_at_or_after_them(spark, two_pchannels):
    node, _ = two_pchannels
    assign(node.address, 1, "rt_0")
    before = produce(node.address, "rt_0", 300, prefix="before")
    time.sleep(0.05)
    middle = int(time.time() * 1000)  # ms: a time tick's physical part
    time.sleep(0.05)
    after = produce(node.address, "rt_0", 200, prefix="after")

    def offsets(**options) -> set[int]:
        return {o for _, o in rows_by_key(read(spark, node, pchannels="rt_0", **options))}

    assert offsets(startingTimestamp=str(middle)) == set(after)
    assert offsets(endingTimestamp=str(middle)) == set(before)
    # Kafka's nested {"topic": {"partition": ...}} names pchannel topic_partition
    nested = json.dumps({"rt": {"0": middle}})
    assert offsets(startingOffsetsByTimestamp=nested) == set(after)
    assert offsets(startingOffsets=json.dumps({"rt": {"0": min(after)}})) == set(after)
    later = str(int(time.time() * 1000) + 3_600_000)  # nothing is that new
    with pytest.raises((AnalysisException, PySparkException), match="no message at or after"):
        read(spark, node, pchannels="rt_0", startingTimestamp=later).collect()
    assert not offsets(startingTimestamp=later, startingOffsetsByTimestampStrategy="latest")


def test_a_pchannel_that_does_not_exist_fails_at_once(spark, two_pchannels):
    node, _ = two_pchannels
    started = time.monotonic()
    with pytest.raises((AnalysisException, PySparkException)) as err:
        read(spark, node, pchannels="ra_0,ra_9").collect()
    assert "no such pchannel: ra_9" in str(err.value)
    assert time.monotonic() - started < 30  # not the 60 s discovery timeout
