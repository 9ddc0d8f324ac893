"""Pure arithmetic of the benchmark: percentiles, rates and the open-loop schedule.

Kept free of I/O so the numbers every table and plot rests on are tested directly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of already sorted values.

    Nearest rank, not interpolation: p999 of 1,000 samples is the largest one, the
    honest answer when there are too few samples to say more.
    """
    if not sorted_values:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    # round first: 99.9 / 100 * 1000 is 999.0000000000001 in binary floating point
    rank = max(1, math.ceil(round(q / 100 * len(sorted_values), 9)))
    return sorted_values[rank - 1]


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / p999 / max in milliseconds and the sample count."""
    ordered = sorted(latencies_s)
    return {
        "count": len(ordered),
        "p50_ms": percentile(ordered, 50) * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "p999_ms": percentile(ordered, 99.9) * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def rounds_summary(rounds: Sequence[dict]) -> dict:
    """Several rounds of one open-loop workload: the median of each percentile over the
    rounds as the headline, the worst round's p99 beside it, every round kept.

    One 5-second round at 1000 msg/s has its p99 in its 50 slowest samples, so a single
    stall of the machine (a slow fsync, a burst of writeback) decides it: the same
    harness gave Redis p99 1.15 and 7.83 ms in two full runs 40 minutes apart. The
    median says what is typical; the worst round and the rounds say what is not.
    """
    if not rounds:
        raise ValueError("no rounds to summarize")

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    return {
        **{k: v for k, v in rounds[0].items() if not k.endswith("_ms") and k != "count"},
        "count": sum(r["count"] for r in rounds),
        "failed": sum(r.get("failed", 0) for r in rounds),
        "p50_ms": median("p50_ms"),
        "p99_ms": median("p99_ms"),
        "p999_ms": median("p999_ms"),
        "max_ms": max(r["max_ms"] for r in rounds),
        "p99_worst_ms": max(r["p99_ms"] for r in rounds),
        "rounds": list(rounds),
    }


def rate(count: int, seconds: float) -> float:
    """Messages per second; a run that moved nothing or took no time is an error."""
    if count <= 0 or seconds <= 0:
        raise ValueError(f"no rate from {count} messages in {seconds} s")
    return count / seconds


def schedule(start: float, per_second: float, index: int) -> float:
    """When message `index` of an open-loop run is due.

    Latency is measured from this instant, not from when the message was actually
    sent, so a system that stalls is charged for the queue it built (no coordinated
    omission).
    """
    return start + index / per_second


def split(total: int, parts: int) -> list[int]:
    """`total` messages spread over `parts` producers, the remainder to the first ones."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def batch_size(payload_bytes: int, max_messages: int = 512, max_bytes: int = 256 * 1024) -> int:
    """Messages per produce batch: many small ones, fewer large ones (bounded frame)."""
    return max(1, min(max_messages, max_bytes // max(1, payload_bytes)))
