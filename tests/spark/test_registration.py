"""`format("streamwal")` in a fresh interpreter with no register call, as a user types it:
PySpark finds the installed pyspark_streamwal module; a misspelled option is refused with
the options there are. And a wheel built from the folders carries that module."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from streamwal.message import MsgType
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_cluster import LocalCluster
from tests.spark.helpers import produce
from tests.support import readme_blocks, wait_for

ROOT = Path(__file__).resolve().parents[2]

SPARK_MD = ROOT / "docs" / "spark.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", SPARK_MD.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture
def cluster(tmp_path):
    """A coord and a node, pchannels events_0 and events_1 holding vchannel messages."""

    async def start() -> LocalCluster:
        c = LocalCluster(tmp_path / "cluster", nodes=1, log_level="warning")
        await c.start()
        await c.create_channels(2, prefix="events")

        async def assigned():
            described = await c.describe()
            states = {d.meta.state for d in described.values()}
            return described if states == {pb.PCHANNEL_META_STATE_ASSIGNED} else None

        for name, d in (await wait_for(assigned, 30, what="events_* assigned")).items():
            produce(c.node_address(1), name, 300, term=d.meta.channel.term,
                    vchannel=f"{name}_v1", msg_type=MsgType.Insert)  # fmt: skip
        return c

    c = asyncio.run(start())
    yield c
    asyncio.run(c.close())


def _readme_spark() -> tuple[list[str], str]:
    """The README's Spark walk-through: its shell commands and its program."""
    ((sh, commands), (python, program)) = readme_blocks("spark")
    assert (sh, python) == ("sh", "python")
    return [line for line in commands.splitlines() if line.strip()], program


def test_the_docs_examples_run_in_a_fresh_python_with_no_register_call(cluster, tmp_path):
    """The must-show: `python -c` with format("streamwal") and no register call reads what
    was produced, and a misspelled option is refused with the options there are.

    The README's walk-through comes first, in a fresh shell holding only PATH (the
    virtualenv's first) and the coord address: its exports alone must let Spark's workers
    find the data source, its produce goes through the coord into `orders` (created as
    Getting started does), and its program, then docs/spark.md's examples in page order,
    run in the one interpreter its `python` line starts (one JVM for all of them)."""
    commands, readme_program = _readme_spark()
    assert commands[-1].startswith("python orders_count.py"), commands
    program = "\n".join([readme_program, *BLOCKS])
    assert 'format("streamwal")' in program and "dataSource.register" not in program
    assert "startingTimestamps" in program  # the refusal is one of the examples
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "STREAMWAL_COORD": cluster.coord_address, "PROGRAM": program}  # fmt: skip
    if "JAVA_HOME" in os.environ:  # where a machine's Java is not on /usr/bin
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    subprocess.run(["streamwal", "channel", "create", "orders"], env=env, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    script = "\n".join([*commands[:-1], 'exec python -c "$PROGRAM"'])
    # cwd elsewhere: nothing from the checkout is importable but what is installed
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert json.loads(done.stdout.splitlines()[0])["messages"] == 1000  # produce's summary
    assert re.search(r"^\|\s*orders\s*\|\s*1000\s*\|$", done.stdout, re.MULTILINE), done.stdout


def test_a_wheel_built_from_the_folders_carries_the_module(tmp_path):
    """As the Dockerfile builds it: pyproject.toml and the folders, nothing else."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    for folder in (
        "common",
        "proto",
        "node",
        "coord",
        "operator",
        "client",
        "spark",
        "bench",
        "testing",
    ):
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
