"""`streamwal bench trace`: the spans read from the kernel's scheduler events.

The parser is checked on lines the kernel wrote for one send each:
- one_send.trace: a streamwal node (pid 12167) and the benchmark's client (12166, its
  clock thread 12242) on one CPU, the traces holding `sched_wakeup` lines as well;
- cross_cpu_send.trace: the node (15730) on the other CPU from the client (15723, its
  clock thread 15808); the kernel recorded no switch-in of the node from the idle task,
  as on the machine where the first parser, which needed it, saw 4 sends of ~1000;
- preempted_send.trace: Redis (16759) preempts the client (16756, its clock thread
  16764) right after the request and answers it without a wake-up, as in half of
  Redis's sends, which the first parser left out.
The command runs end to end where this machine lets it trace (root and tracefs).
"""

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from streamwal.bench.sched_trace import mounted_tracefs, parse

ONE_SEND = (Path(__file__).parent / "one_send.trace").read_text().splitlines()
CROSS_CPU_SEND = (Path(__file__).parent / "cross_cpu_send.trace").read_text().splitlines()
PREEMPTED_SEND = (Path(__file__).parent / "preempted_send.trace").read_text().splitlines()


def test_one_send_splits_into_client_server_client() -> None:
    got = parse(ONE_SEND, server={12167}, client=12166)
    assert got.client_send_us == [pytest.approx(69, abs=0.5)]  # clock 609613 -> 609682
    assert got.server_us == [pytest.approx(149, abs=0.5)]  # -> the answer wakes 609831
    assert got.client_answer_us == [pytest.approx(53, abs=0.5)]  # -> asleep 609884
    assert got.server_wait_us == [pytest.approx(11, abs=0.5)]  # the node runs 609693
    assert got.wake_to_run_us == [pytest.approx(7, abs=0.5)]  # the client runs 609838


def test_a_server_on_another_cpu_is_timed_by_the_wake_ups() -> None:
    got = parse(CROSS_CPU_SEND, server={15730}, client=15723)
    assert got.client_send_us == [pytest.approx(40, abs=0.5)]  # 039361 -> 039401
    assert got.server_us == [pytest.approx(106, abs=0.5)]  # -> the answer wakes 039507
    assert got.client_answer_us == [pytest.approx(51, abs=0.5)]  # -> asleep 039558
    assert got.server_wait_us == []  # its switch-in was not recorded
    assert got.wake_to_run_us == [pytest.approx(24, abs=0.5)]


def test_a_server_that_preempts_the_client_ends_its_turn_handing_the_cpu_back() -> None:
    got = parse(PREEMPTED_SEND, server={16759}, client=16756)
    assert got.client_send_us == [pytest.approx(70, abs=0.5)]  # 483876 -> 483946
    assert got.server_wait_us == [pytest.approx(6, abs=0.5)]  # the client is preempted
    assert got.server_us == [pytest.approx(32, abs=0.5)]  # -> Redis sleeps, 483978
    assert got.client_answer_us == [pytest.approx(45, abs=0.5)]  # -> asleep 484023
    assert got.wake_to_run_us == []  # no wake-up: the client was runnable all along


def test_a_send_cut_by_the_window_is_left_out() -> None:
    no_clock = [line for line in ONE_SEND if "609613" not in line]  # the send's wake-up
    got = parse(no_clock, server={12167}, client=12166)
    assert got.client_send_us == []
    assert got.server_us == [pytest.approx(149, abs=0.5)]  # the rest is still whole
    no_request = [line for line in ONE_SEND if "609682" not in line]
    got = parse(no_request, server={12167}, client=12166)
    assert got.client_send_us == [] and got.server_us == [] and got.server_wait_us == []
    assert got.client_answer_us == [pytest.approx(53, abs=0.5)]


def test_other_processes_are_not_counted() -> None:
    got = parse(ONE_SEND, server={4242, 4243}, client=12166)
    assert got.server_us == [] and got.client_send_us == [] and got.client_answer_us == []


def _can_trace() -> str | None:
    """Why this machine cannot trace (tracefs mounted here if it can), or None."""
    try:
        mounted_tracefs()
    except click.ClickException as err:
        return err.message
    return None


@pytest.mark.timeout(120)
def test_trace_command_reports_the_node_and_client_spans() -> None:
    """Redis as well: it preempts its client and answers without waking it."""
    reason = _can_trace()
    if reason:
        pytest.skip(reason)
    streamwal = Path(sys.executable).with_name("streamwal")
    systems = ["--system", "streamwal_async", "--system", "redis"]
    length = ["--rounds", "1", "--seconds", "2", "--window", "1"]
    out = subprocess.run(
        [str(streamwal), "bench", "trace", *systems, *length],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0].startswith("system")
    results = json.loads(out.stdout.strip().splitlines()[-1])["systems"]
    assert set(results) == {"streamwal_async", "redis"}
    for entry in results.values():
        # ~1000 sends in the 1-s window. A turn preempted in the middle is not whole, and
        # on a loaded machine (the suite's other worker) 20-30 % were (701 and 788 seen):
        # most, not nearly all, must be whole.
        assert entry["server_us"]["n"] > 500, entry
        assert entry["client_send_us"]["n"] > 500 and entry["client_answer_us"]["n"] > 500
        turns = sum(entry[span]["p50"] for span in ("client_send_us", "server_us"))
        assert 0 < turns < entry["latency"]["p50_ms"] * 1000, entry
