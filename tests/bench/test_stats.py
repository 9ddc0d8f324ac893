"""The benchmark's arithmetic: every figure in the table rests on these."""

import pytest

from streamwal.bench import stats
from streamwal.bench.interleaved import turns
from streamwal.bench.report import ceiling_entry, ratios


def test_nearest_rank_percentiles_of_a_known_sample():
    values = [float(v) for v in range(1, 1001)]  # 1 .. 1000
    assert stats.percentile(values, 50) == 500.0
    assert stats.percentile(values, 99) == 990.0
    assert stats.percentile(values, 99.9) == 999.0
    assert stats.percentile(values, 100) == 1000.0
    assert stats.percentile(values, 0) == 1.0


def test_p999_of_few_samples_is_the_worst_one():
    assert stats.percentile([0.1, 0.2, 5.0], 99.9) == 5.0


def test_latency_summary_is_in_milliseconds_and_order_free():
    summary = stats.latency_summary([0.003, 0.001, 0.002])
    assert summary["count"] == 3
    assert summary["p50_ms"] == pytest.approx(2.0)
    assert summary["max_ms"] == pytest.approx(3.0)


def test_rounds_give_the_median_round_and_keep_the_worst():
    def round_(p99: float) -> dict:
        return {"rate_per_s": 1000.0, "count": 8000, "p50_ms": 0.4, "p99_ms": p99,
                "p999_ms": p99 * 2, "max_ms": p99 * 3}  # fmt: skip

    rounds = [round_(16.5), round_(1.4), round_(1.6)]  # one stalled, right after a burst
    summary = stats.rounds_summary(rounds)
    assert summary["p99_ms"] == 1.6 and summary["p999_ms"] == 3.2
    assert summary["p99_worst_ms"] == 16.5 and summary["max_ms"] == pytest.approx(49.5)
    assert summary["count"] == 24000 and summary["rate_per_s"] == 1000.0
    assert summary["rounds"] == rounds
    one = stats.rounds_summary(rounds[:1])
    assert one["p99_ms"] == one["p99_worst_ms"] == 16.5
    with pytest.raises(ValueError):
        stats.rounds_summary([])


@pytest.mark.parametrize("bad", [[], None])
def test_no_samples_is_an_error_not_a_zero(bad):
    with pytest.raises((ValueError, TypeError)):
        stats.latency_summary(bad)


def test_rate_refuses_empty_runs():
    assert stats.rate(1000, 0.5) == 2000.0
    with pytest.raises(ValueError):
        stats.rate(0, 1.0)
    with pytest.raises(ValueError):
        stats.rate(10, 0.0)


def test_open_loop_schedule_does_not_drift():
    # message i is due at start + i / rate, whatever happened to earlier ones
    assert stats.schedule(10.0, 1000.0, 0) == 10.0
    assert stats.schedule(10.0, 1000.0, 2500) == pytest.approx(12.5)


def test_split_and_batch_size():
    assert stats.split(10, 4) == [3, 3, 2, 2]
    assert sum(stats.split(1_000_003, 8)) == 1_000_003
    assert stats.batch_size(128) == 512
    assert stats.batch_size(4096) == 64
    assert stats.batch_size(10 * 1024 * 1024) == 1


def _entry(produce: float, consume: float, p99: float) -> dict:
    return {
        "produce_msgs_per_s": produce,
        "produce_p50_ms": 1.0,
        "produce_p99_ms": p99,
        "produce_p999_ms": p99 * 2,
        "produce_p99_worst_ms": p99 * 3,
        "produce_after_burst_p99_ms": p99 * 4,
        "consume_msgs_per_s": consume,
        "e2e_p50_ms": 1.0,
        "e2e_p99_ms": 2.0,
        "durability": "x",
        "produce": {"128B_x1": {"msgs_per_s": produce / 2}, "128B_x4": {"msgs_per_s": produce}},
    }


def test_ceiling_takes_the_tighter_half_per_workload():
    noop = _entry(100_000, 500_000, 1.0)
    rocks = {
        "write_128B_x1": {"msgs_per_s": 80_000},  # disk is tighter here
        "write_128B_x4": {"msgs_per_s": 400_000},  # the transport is tighter here
        "read_record_128B": {"msgs_per_s": 2_000_000},
    }
    c = ceiling_entry(noop, rocks)
    assert c["produce"]["128B_x1"]["msgs_per_s"] == 50_000
    assert c["produce"]["128B_x4"]["msgs_per_s"] == 100_000
    assert c["produce_msgs_per_s"] == 100_000
    assert c["consume_msgs_per_s"] == 500_000
    assert c["produce_p99_ms"] == 1.0 and c["produce_p99_worst_ms"] == 3.0


def test_ratios_say_how_streamwal_compares():
    systems = {
        "streamwal": _entry(300_000, 400_000, 3.0),
        "redis": _entry(100_000, 200_000, 2.0),
        "nats": {"error": "down", "durability": "x"},
    }
    vs = ratios(systems)
    assert vs["produce_x_redis"] == 3.0
    assert vs["consume_x_redis"] == 2.0
    assert vs["p99_ms_minus_redis"] == 1.0
    assert not any("nats" in k for k in vs)


def test_interleaved_turns_measure_everyone_each_round_and_rotate_who_goes_first():
    order = turns(["a", "b", "c"], 4)
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert all(sorted(r) == ["a", "b", "c"] for r in order)
    assert turns([], 3) == []
