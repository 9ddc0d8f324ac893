"""`streamwal bench trace`: the spans read from the kernel's scheduler events.

The parser is checked on lines the kernel wrote (one_send.trace: one send of a streamwal node, pid
12167, answered to the benchmark's client, pid 12166, whose clock thread is 12242);
the command end to end where this machine lets it trace (root and tracefs).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamwal.bench.sched_trace import TRACEFS, parse

ONE_SEND = (Path(__file__).parent / "one_send.trace").read_text()


def test_one_send_splits_into_client_server_client() -> None:
    got = parse(ONE_SEND.splitlines(), server={12167}, client=12166)
    assert got.client_send_us == [pytest.approx(55, abs=0.5)]  # 609630 -> wakes the node
    assert got.server_wait_us == [pytest.approx(8, abs=0.5)]  # woken 609685, runs 609693
    assert got.server_us == [pytest.approx(140, abs=0.5)]  # -> wakes the client 609833
    assert got.wake_to_run_us == [pytest.approx(5, abs=0.5)]
    assert got.client_answer_us == [pytest.approx(46, abs=0.5)]  # 609838 -> asleep


def test_a_send_cut_by_the_window_is_left_out() -> None:
    lines = ONE_SEND.splitlines()
    cut = [line for line in lines if "609630" not in line]  # the client's switch-in
    got = parse(cut, server={12167}, client=12166)
    assert got.client_send_us == []
    assert got.server_us == [pytest.approx(140, abs=0.5)]  # the rest is still whole
    got = parse([line for line in lines if "609685" not in line], {12167}, 12166)
    assert got.server_us == []  # the request's wake-up is not in the window


def test_other_processes_are_not_counted() -> None:
    got = parse(ONE_SEND.splitlines(), server={4242, 4243}, client=12166)
    assert got.server_us == [] and got.client_send_us == []


def _can_trace() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not (TRACEFS / "trace").exists():
        mounted = subprocess.run(
            ["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True
        )
        if mounted.returncode != 0:
            return f"tracefs not mountable: {mounted.stderr.decode().strip()}"
    return None


@pytest.mark.timeout(120)
def test_trace_command_reports_the_node_and_client_spans() -> None:
    reason = _can_trace()
    if reason:
        pytest.skip(reason)
    streamwal = Path(sys.executable).with_name("streamwal")
    args = ["bench", "trace", "--system", "streamwal_async", "--rounds", "1", "--seconds", "2"]
    out = subprocess.run(
        [str(streamwal), *args, "--window", "1"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0].startswith("system")
    entry = json.loads(out.stdout.strip().splitlines()[-1])["systems"]["streamwal_async"]
    # ~1000 sends in the 1-s window; each one's spans are seen whole
    assert entry["server_us"]["n"] > 500, entry
    assert 0 < entry["server_us"]["p50"] < entry["latency"]["p50_ms"] * 1000
    assert entry["client_send_us"]["n"] > 500 and entry["client_answer_us"]["n"] > 500
