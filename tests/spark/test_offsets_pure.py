"""The data source's decisions without Spark or nodes: options, offsets, limits, splits."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from streamwal.errors import InvalidArgument
from streamwal.spark import offsets
from streamwal.spark.discovery import owners_from_pchannel_objects
from streamwal.spark.offsets import Bounds, DataLoss, Range
from streamwal.spark.options import EARLIEST, LATEST, parse_sink, parse_source

NODES = {"nodes": "127.0.0.1:1"}


def test_offset_specs_resolve_against_bounds():
    opts = parse_source(
        {**NODES, "pchannels": "a,b,c", "startingOffsets": '{"a": 5, "b": -1}'}, streaming=True
    )
    bounds = {"a": Bounds(2, 10), "b": Bounds(0, 7), "c": Bounds(3, 9)}
    # c is not in the JSON: the spec's default (latest for a stream)
    assert offsets.resolve(opts.starting, bounds) == {"a": 5, "b": 7, "c": 9}
    batch = parse_source({**NODES, "pchannelPattern": "p_.*"}, streaming=False)
    assert (batch.starting.default, batch.ending.default) == (EARLIEST, LATEST)
    assert batch.selects("p_1") and not batch.selects("q_1") and not batch.selects("xp_1")


@pytest.mark.parametrize(
    ("options", "streaming", "fragment"),
    [
        ({"pchannels": "a", "pchannelPattern": "a"}, False, "exactly one of the options"),
        ({"pchannels": "a", "startingOffsets": '{"a": -3}'}, False, "-2 (earliest)"),
        ({"pchannels": "a", "startingOffsets": "[1]"}, False, "must be an object"),
        ({"pchannels": "a", "endingOffsets": "latest"}, True, "batch queries only"),
        ({"pchannels": "a", "maxOffsetsPerTrigger": "0"}, True, "positive integer"),
        ({"pchannels": "a", "failOnDataLoss": "maybe"}, True, "true or false"),
        ({"pchannelPattern": "("}, True, "bad regex"),
    ],
)
def test_bad_options_name_the_option(options, streaming, fragment):
    with pytest.raises(InvalidArgument) as err:
        parse_source({**NODES, **options}, streaming=streaming)
    assert fragment in str(err.value)


def test_discovery_needs_exactly_one_way():
    with pytest.raises(InvalidArgument, match="exactly one of the options coord"):
        parse_source({"pchannels": "a"}, streaming=False)
    with pytest.raises(InvalidArgument, match="exactly one of the options coord"):
        parse_source({"pchannels": "a", "coord": "h:1", "kubernetes": "ns"}, streaming=False)


def test_data_loss_fails_or_skips():
    r = Range("p", 3, 20)
    assert offsets.effective_start(r, 0, 30, True) == 3
    with pytest.raises(DataLoss, match=r"pchannel p: offsets \[3, 10\)"):
        offsets.effective_start(r, 10, 30, True)
    assert offsets.effective_start(r, 10, 30, False) == 10
    with pytest.raises(DataLoss, match="log ends at 2"):
        offsets.effective_start(r, 0, 2, True)
    # a pchannel first seen mid-query is read from its earliest: truncation is no loss
    assert offsets.effective_start(Range("p", 0, 20, from_earliest=True), 10, 30, True) == 10


def test_rate_limit_shares_the_budget_by_backlog():
    start = {"a": 0, "b": 100, "c": 5}
    latest = {"a": 900, "b": 200, "c": 5}
    limited = offsets.rate_limit(start, latest, 100)
    assert sum(limited[p] - start[p] for p in start) == 100
    assert limited == {"a": 90, "b": 110, "c": 5}
    assert offsets.rate_limit(start, latest, None) == latest
    assert offsets.rate_limit(start, latest, 10_000) == latest
    # every offset is read eventually, in bounded steps
    pos, steps = dict(start), 0
    while pos != latest:
        pos = {**pos, **offsets.rate_limit(pos, latest, 7)}
        steps += 1
        assert steps < 200
    assert offsets.rate_limit({"a": 0, "b": 0}, {"a": 1, "b": 1}, 1) in (
        {"a": 1, "b": 0},
        {"a": 0, "b": 1},
    )


def test_split_covers_each_range_exactly_once():
    rs = [Range("a", 0, 1000), Range("b", 10, 15), Range("c", 7, 7)]
    pieces = offsets.split(rs, 300, None)
    assert all(p.size <= 300 for p in pieces)
    for r in rs:
        covered = [o for p in pieces if p.pchannel == r.pchannel for o in range(p.start, p.end)]
        assert covered == list(range(r.start, r.end))
    assert len(offsets.split(rs, 10_000, 8)) >= 8


def test_ranges_of_a_micro_batch():
    got = offsets.ranges({"a": 5, "b": 3}, {"a": 9, "b": 3, "n": 4})
    assert got == [Range("a", 5, 9), Range("n", 0, 4, from_earliest=True)]
    assert offsets.cap({"a": 9, "b": 4}, {"a": 7}) == {"a": 7, "b": 4}


def test_only_assigned_pchannel_objects_with_an_address_are_owners():
    items = [
        {"metadata": {"name": "p0"},
         "status": {"state": "Assigned", "term": 3, "node": {"id": 2, "address": "h:1"}}},
        {"metadata": {"name": "p1"}, "status": {"state": "Assigning", "term": 4,
                                                "node": {"id": 1, "address": "h:2"}}},
        {"metadata": {"name": "p2"}},
    ]  # fmt: skip
    snapshot = owners_from_pchannel_objects(items)
    owners = snapshot.owners
    assert list(owners) == ["p0"]
    assert snapshot.existing == {"p0", "p1", "p2"}  # p1 is in a failover, p2 unassigned
    assert (owners["p0"].term, owners["p0"].address, owners["p0"].node_id) == (3, "h:1", 2)


@pytest.mark.parametrize(
    ("options", "streaming", "fragment"),
    [
        ({"pchannels": "a", "startingTimestamps": "1"}, False,
         "unknown option 'startingTimestamps' for the streamwal source (did you mean "
         "startingTimestamp?); its options are: coord, "),
        ({"pchannels": "a", "path": "/x"}, False, "unknown option 'path'"),
        ({"pchannels": "a", "startingOffsets": "earliest", "startingTimestamp": "5"}, False,
         "options startingOffsets and startingTimestamp: set only one of them"),
        ({"pchannels": "a", "startingTimestamp": "yesterday"}, False, "timestamp in ms"),
        ({"pchannels": "a", "startingOffsetsByTimestamp": '{"a": -1}'}, False, "timestamp in ms"),
        ({"pchannels": "a", "startingOffsetsByTimestampStrategy": "latest"}, False,
         "applies to startingTimestamp and startingOffsetsByTimestamp only"),
        ({"pchannels": "a", "startingTimestamp": "5",
          "startingOffsetsByTimestampStrategy": "skip"}, False, "expected error or latest"),
        ({"pchannels": "a", "maxOffsetsPerTrigger": "10"}, False,
         "maxOffsetsPerTrigger is for streaming queries only"),
        ({"pchannels": "a", "endingTimestamp": "5"}, True,
         "endingTimestamp is for batch queries only"),
        ({"pchannels": "a", "maxTriggerDelay": "5m"}, True, "with minOffsetsPerTrigger only"),
        ({"pchannels": "a", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "300"}, True,
         "give a unit"),
        ({"pchannels": "a", "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"}, True,
         "above maxOffsetsPerTrigger"),
        ({"pchannels": "a", "startingOffsets": '{"b": 1}'}, False,
         "names pchannel b, which the query does not read"),
        ({"pchannels": "t_0", "startingOffsets": '{"t": {"0": 1}, "t_0": 2}'}, False,
         "named twice"),
        ({"pchannels": "t_0", "startingOffsets": '{"t": {"zero": 1}}'}, False,
         "a partition must be a number"),
        ({"pchannels": "a", "kubeconfig": "/k"}, False, "kubeconfig is for the kubernetes"),
    ],
)  # fmt: skip
def test_option_mistakes_are_refused_with_what_to_do(options, streaming, fragment):
    with pytest.raises(InvalidArgument) as err:
        parse_source({**NODES, **options}, streaming=streaming)
    assert fragment in str(err.value)


def test_spark_lower_cases_option_names_and_they_still_count():
    spark_options = CaseInsensitiveDict(
        {"nodes": "h:1", "pchannelpattern": "p_.*", "maxoffsetspertrigger": "7"}
    )
    opts = parse_source(spark_options, streaming=True)
    assert (opts.pattern, opts.max_offsets_per_trigger) == ("p_.*", 7)


def test_kafkas_nested_offsets_name_topic_partition_pchannels():
    opts = parse_source(
        {**NODES, "pchannelPattern": "dml_.*|x",
         "startingOffsets": '{"dml": {"0": 5, "1": -2}, "x": 3}'}, streaming=False,
    )  # fmt: skip
    assert opts.starting.per_pchannel == (("dml_0", 5), ("dml_1", EARLIEST), ("x", 3))
    assert opts.required == {"dml_0", "dml_1", "x"}


def test_timestamps_resolve_to_the_first_offset_at_or_after_them():
    bounds = {"a": Bounds(0, 50), "b": Bounds(10, 20)}
    one_time = parse_source({**NODES, "pchannels": "a,b", "startingTimestamp": "1700000000000"},
                            streaming=False).starting  # fmt: skip
    assert offsets.timestamps(one_time, bounds) == {"a": 1700000000000, "b": 1700000000000}
    # b has nothing at or after that time: Kafka's default strategy is to fail...
    with pytest.raises(InvalidArgument, match="pchannel b has no message at or after"):
        offsets.resolve(one_time, bounds, {"a": 31, "b": None}, not_found_latest=False)
    # ...the strategy `latest` (and any end) takes the log end
    assert offsets.resolve(one_time, bounds, {"a": 31, "b": None}) == {"a": 31, "b": 20}
    per_pchannel = parse_source(
        {**NODES, "pchannels": "a,b", "startingOffsetsByTimestamp": '{"a": 5}'}, streaming=False
    ).starting
    with pytest.raises(InvalidArgument, match="names no timestamp for pchannel b"):
        offsets.timestamps(per_pchannel, bounds)


def test_min_offsets_per_trigger_holds_a_batch_until_enough_or_too_long():
    start, latest = {"a": 0, "b": 10}, {"a": 40, "b": 30, "new": 0}  # 60 new offsets
    hold = offsets.delay_trigger
    assert hold(start, latest, 100, 5.0, 60.0)  # too few, not waited long enough
    assert not hold(start, latest, 60, 5.0, 60.0)  # enough
    assert not hold(start, latest, 100, 60.0, 60.0)  # waited maxTriggerDelay
    assert not hold(start, latest, 100, None, 60.0)  # the first micro-batch
    assert not hold(start, latest, None, 5.0, 60.0)  # not asked
    opts = parse_source({**NODES, "pchannels": "a", "minOffsetsPerTrigger": "100",
                         "maxTriggerDelay": "90s"}, streaming=True)  # fmt: skip
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_s) == (100, 90.0)


def test_the_sink_refuses_what_it_would_ignore():
    with pytest.raises(InvalidArgument, match="unknown option 'topic' for the streamwal sink"):
        parse_sink({**NODES, "topic": "t"}, ("payload",))
    with pytest.raises(InvalidArgument, match=r"no use for the column\(s\) key, headers"):
        parse_sink({**NODES, "pchannel": "p"}, ("key", "payload", "headers"))
    opts = parse_sink({**NODES, "checkpointLocation": "/ck", "batchRows": "10"},
                      ("payload", "vchannel"))  # fmt: skip
    assert (opts.batch_rows, opts.pchannel) == (10, None)
