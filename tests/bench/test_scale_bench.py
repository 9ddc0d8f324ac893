"""`streamwal bench scale` at its smallest, as scripts run it: real coord and node
processes, one node killed, the simulator's run, one JSON object on stdout, the plot.

Not a timed test: the figures are read off the benchmark on a quiet machine
(docs/benchmarks.md, "Scale"); here the run must complete, lose nothing acknowledged and
serve every moved pchannel again.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(180)
def test_bench_scale_fails_a_node_over_and_prints_json(tmp_path: Path) -> None:
    streamwal = Path(sys.executable).with_name("streamwal")
    out = subprocess.run(
        [str(streamwal), "bench", "scale", "--pchannels", "8", "--replicas", "3",
         "--nodes", "3", "--sample", "1", "--grace", "1.0",
         "--sim-pchannels", "40", "--sim-nodes", "4", "--out", "scale.png"],
        capture_output=True, text=True, timeout=150, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    (case,) = result["cases"]
    assert case["pchannels"] == 8 and case["replicas"] == 3
    assert case["killed_node_pchannels"] > 0 and case["failover_s"] > 0
    assert case["not_served_after_limit"] == 0, case
    assert case["term_rises"] == [1], case  # one term per failover, no inflation
    assert case["sample_acked"] > 0 and case["sample_lost"] == 0, case
    assert not case["sample_violations"], case
    idle = case["idle_node_cpu"]  # CPU s/s of each node with nothing produced
    assert len(idle) == 3 and all(c is not None and 0 <= c < 2 for c in idle), case
    assert result["plot"] == "scale.png"  # --out, from the cwd
    assert (tmp_path / result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sim = result["sim"]
    assert sim["pchannels"] == 40 and sim["its_pchannels"] > 0
    assert sim["failover_s"] <= sim["grace_s"] + 1.0, sim
