"""`format("streamwal")` in a fresh interpreter with no register call, as a user types it:
PySpark finds the installed pyspark_streamwal module; a misspelled option is refused with
the options there are. And a wheel built from the folders carries that module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.spark.helpers import assign, produce

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
reader = spark.read.format("streamwal").option("nodes", sys.argv[1]).option("pchannels", "reg_0")
rows = reader.load().select("offset", "payload").collect()
print(json.dumps({r.offset: r.payload.decode() for r in rows}))
try:
    reader.option("startingTimestamps", "0").load().collect()
except Exception as exc:
    print(str(exc))
"""


def test_a_fresh_python_reads_with_no_register_call_and_refuses_unknown_options(
    start_node, tmp_path
):
    node = start_node("n1")
    assign(node.address, 1, "reg_0")
    produced = produce(node.address, "reg_0", 50)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYTHONPATH", None)
    # cwd elsewhere: nothing from the checkout is importable but what is installed
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, node.address],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert json.loads(lines[0]) == {str(o): p.decode() for o, p in produced.items()}
    refusal = "\n".join(lines[1:])
    assert "unknown option 'startingtimestamps' for the streamwal source" in refusal
    assert "(did you mean startingTimestamp?)" in refusal


def test_a_wheel_built_from_the_folders_carries_the_module(tmp_path):
    """As the Dockerfile builds it: pyproject.toml and the folders, nothing else."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    for folder in ("common", "proto", "node", "coord", "operator", "client", "spark", "bench"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(tmp_path / "dist")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("streamwal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_streamwal/__init__.py" in names
    assert "streamwal/spark/source.py" in names
    assert not [n for n in names if n.startswith("streamwal/spark/pyspark_streamwal")]
