"""`streamwal bench compare` end to end, at its smallest: real servers, real clients.

Runs the command as a user would (its own process, every peer started by it) and checks
what scripts and CI rely on: one JSON object last on stdout, an entry per system with
positive numbers and a stated durability, and a PNG plot.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMS = (
    "streamwal",
    "streamwal_async",
    "streamwal_r3",
    "redis",
    "redis_always",
    "redis_r3",
    "nats",
    "nats_r3",
    "ceiling",
)
NUMBERS = ("produce_msgs_per_s", "produce_p99_ms", "consume_msgs_per_s", "e2e_p99_ms")


def _streamwal() -> str:
    beside = Path(sys.executable).with_name("streamwal")
    return str(beside) if beside.exists() else "streamwal"


@pytest.mark.timeout(150)
def test_compare_smoke_prints_a_table_then_the_json_of_every_system(tmp_path):
    plot = tmp_path / "compare.png"
    proc = subprocess.Popen(
        [_streamwal(), "bench", "compare", "--smoke", "--out", str(plot)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        out, err = proc.communicate(timeout=130)
    finally:
        if proc.poll() is None:  # SIGTERM lets the benchmark stop the servers it started
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err[-3000:]

    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    assert "durability (what an ack means):" in out  # the table came first
    assert set(SYSTEMS) <= set(result["systems"])
    for name in SYSTEMS:
        entry = result["systems"][name]
        assert "error" not in entry, (name, entry)
        for key in NUMBERS:
            assert entry[key] > 0, (name, key, entry[key])
        assert entry["durability"].strip(), name
        for run in entry["produce"].values():
            assert run["msgs_per_s"] > 0, (name, run)
        if name != "ceiling":  # the interleaved rounds and the one right after the bursts
            assert entry["latency"]["count"] > 0 and len(entry["latency"]["rounds"]) >= 1
            assert entry["latency_after_burst"]["count"] > 0, name
            assert entry["produce_after_burst_p99_ms"] > 0, name
        if "consume" in entry:  # every stored message was read back
            assert entry["consume"]["count"] == entry["consume"]["expected"], name
    sw = result["systems"]["streamwal"]
    assert sw["vs"]["produce_x_redis"] > 0
    assert not any("streamwal" in k for k in sw["vs"])  # its other runs are not peers
    same_class = result["systems"]["streamwal_async"]
    assert same_class["durability"].startswith("async")
    assert same_class["vs"]["produce_x_redis"] > 0 and "p99_ms_minus_nats" in same_class["vs"]
    r3 = result["systems"]["streamwal_r3"]
    assert r3["durability"].startswith("quorum")
    assert r3["failover"]["kills"] == 1 and 0 < r3["failover_max_s"] < 30, r3["failover"]
    assert r3["failover"]["acked"] > 0 and r3["failover"]["history_ok"], r3["failover"]
    assert "streamwal_r3 failover: leader SIGKILLed 1x" in out
    # The replicated run against the replicated peers only, in the same run.
    assert set(r3["vs"]) == {
        f"{k}_{p}"
        for k in ("produce_x", "consume_x", "p99_ms_minus")
        for p in ("redis_r3", "nats_r3")
    }
    assert "streamwal_r3 vs nats_r3: produce" in out
    assert result["systems"]["redis_r3"]["durability"].startswith("primary + 2 replicas")
    assert "3 replicas" in result["systems"]["nats_r3"]["durability"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
