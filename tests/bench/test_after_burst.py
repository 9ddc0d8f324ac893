"""`streamwal bench after-burst`: which RocksDB jobs overlapped a round, read from lines
as RocksDB 9 writes its LOG; and the command end to end at its smallest."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamwal.bench.after_burst import rocksdb_activity

T0 = 1795800000.0  # the round runs from T0 to T0 + 5


def _event(at: float, fields: str) -> str:
    micros = int(at * 1e6)
    return (
        f"2026/11/27-17:24:06.718823 140187096471232 EVENT_LOG_v1 "
        f'{{"time_micros": {micros}, {fields}}}'
    )


LOG = "\n".join(
    [
        "2026/11/27-17:24:06.700000 140187096471232 [db/db_impl/db_impl.cc:1] some text",
        # a flush and a compaction both over before the round: not counted
        _event(T0 - 3, '"job": 2, "event": "flush_started", "total_data_size": 67110976'),
        _event(T0 - 2.9, '"job": 2, "event": "flush_finished"'),
        _event(T0 - 2, '"job": 3, "event": "compaction_started", "input_data_size": 10'),
        _event(T0 - 1, '"job": 3, "event": "compaction_finished", "total_output_size": 9'),
        _event(T0 - 1, '"job": 3, "event": "table_file_deletion", "file_number": 9'),
        # a flush started before the round and finished in it
        _event(T0 - 0.5, '"job": 4, "event": "flush_started", "total_data_size": 64000000'),
        _event(T0 + 0.2, '"job": 4, "event": "flush_finished"'),
        # a compaction started in the round, finished after it, and its deletions
        _event(T0 + 0.3, '"job": 5, "event": "compaction_started", "input_data_size": 256000000'),
        _event(T0 + 4.9, '"job": 5, "event": "table_file_deletion", "file_number": 12'),
        _event(T0 + 5.5, '"job": 5, "event": "compaction_finished", "total_output_size": 25e7'),
        _event(T0 + 5.6, '"job": 5, "event": "table_file_deletion", "file_number": 13'),
        # a flush still running when the LOG was read
        _event(T0 + 4, '"job": 6, "event": "flush_started", "total_data_size": 1000000'),
        # a compaction that starts after the round
        _event(T0 + 6, '"job": 7, "event": "compaction_started", "input_data_size": 5'),
        '2026/11/27-17:24:07.000000 1 EVENT_LOG_v1 {"time_micros": 17958',  # cut short
    ]
)


def test_jobs_that_overlapped_the_round_are_counted_and_the_others_are_not() -> None:
    assert rocksdb_activity(LOG, T0, T0 + 5) == {
        "flushes": 2,
        "flush_mb": 65.0,
        "compactions": 1,
        "compaction_read_mb": 256.0,
        "compaction_written_mb": 250.0,
        "files_deleted": 1,
    }


def test_a_log_without_jobs_reports_none() -> None:
    assert rocksdb_activity("no events here\n", T0, T0 + 5)["flushes"] == 0


@pytest.mark.timeout(120)
def test_smoke_run_prints_each_runs_round_and_rocksdb_activity_as_json(tmp_path) -> None:
    streamwal = Path(sys.executable).with_name("streamwal")
    out = subprocess.run(
        [str(streamwal), "bench", "after-burst", "--smoke", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (run,) = result["runs"]
    assert run["failed"] == 0
    assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    assert result["p99_ms_sorted"] == [run["p99_ms"]]
    assert set(run["produce_msgs_per_s"]) == {"128B_x1", "128B_x4", "4096B_x1", "4096B_x4"}
    assert set(run["rocksdb_in_round"]) >= {"flushes", "compactions", "files_deleted"}
    assert not list(tmp_path.glob("bench-after-burst-*"))  # each run's node dir removed
