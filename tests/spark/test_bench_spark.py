"""`streamwal bench spark` runs both paths end to end and prints the keys docs/benchmarks.md
quotes (rates are never asserted: benchmarks are not timed tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_spark_benchmark_reads_and_writes_and_reports_cpu_per_message(tmp_path):
    streamwal = Path(sys.executable).parent / "streamwal"
    done = subprocess.run(
        [str(streamwal), "bench", "spark", "--messages", "4000", "--runs", "1",
         "--warm-up", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    for path in ("read", "write"):
        assert result[f"{path}_msgs_per_s"] > 0
        cpu = result[f"{path}_cpu_us_per_msg"]
        assert set(cpu) == {"driver", "jvm", "python_workers", "node"}
        assert cpu["jvm"] > 0 and cpu["python_workers"] > 0 and cpu["node"] > 0
