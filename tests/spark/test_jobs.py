"""The pipeline jobs under spark-submit (a fresh JVM each: slow): message type counts of a
vchannel, and the Parquet compaction killed with SIGKILL mid-run then rerun — no row
twice, none missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamwal.message import MsgType
from tests.spark.helpers import assign, produce

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "spark" / "jobs"
SUBMIT = Path(sys.executable).parent / "spark-submit"

pytestmark = pytest.mark.slow


def submit(script: str, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(SUBMIT), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
             str(JOBS / script), *args],
            stdout=subprocess.PIPE, stderr=out, env=env, start_new_session=True,
        )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0
    return out.decode()


def test_message_type_counts_job(start_node, tmp_path):
    node = start_node("n1")
    assign(node.address, 1, "pj_0")
    produce(node.address, "pj_0", 300, vchannel="pj_0_v1")
    produce(node.address, "pj_0", 100, vchannel="pj_0_v1", msg_type=MsgType.Delete)
    produce(node.address, "pj_0", 50, vchannel="pj_0_v2")
    proc = submit("message_type_counts.py", "--nodes", node.address, "--vchannel", "pj_0_v1",
                  "--json", log=tmp_path / "counts.log")  # fmt: skip
    out = finish(proc)
    assert json.loads(out.strip().splitlines()[-1]) == {"Delete": 100, "Insert": 300}


def test_compaction_killed_and_rerun_writes_each_message_once(spark, start_node, tmp_path):
    node = start_node("n1")
    assign(node.address, 1, "pc_0", "pc_1")
    produced = {}
    for p in ("pc_0", "pc_1"):
        produced.update({(p, o): v for o, v in produce(node.address, p, 3000).items()})
    out, ck = tmp_path / "out", tmp_path / "ck"
    common = ["--nodes", node.address, "--pchannel-pattern", "pc_.*", "--output", str(out),
              "--checkpoint", str(ck)]  # fmt: skip
    # Small micro-batches, so the kill lands while most of the log is still to be read.
    per_trigger = 500
    proc = submit("compact_to_parquet.py", *common, "--max-offsets-per-trigger", str(per_trigger),
                  "--trigger", "1 second", log=tmp_path / "run1.log")  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(list((out / "_spark_metadata").glob("[0-9]*"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "job did not commit"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-run: later batches may be half written
        proc.wait(10)
    # the kill left work undone: fewer batches committed than it takes to write them all
    assert len(list((out / "_spark_metadata").glob("[0-9]*"))) * per_trigger < len(produced)
    # The rerun without the limit: the batch the kill interrupted is replayed with the
    # offsets its run logged, then the rest is one micro-batch (not ten of 500).
    finish(submit("compact_to_parquet.py", *common, "--once", log=tmp_path / "run2.log"))
    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.pchannel, r.offset) for r in rows]
    assert len(keys) == len(set(keys)), "a message was written twice"
    assert {(r.pchannel, r.offset): r.payload for r in rows} == produced
