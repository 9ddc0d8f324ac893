"""Fixtures for the Spark tests: one local SparkSession, real node processes, helpers.

Spark starts slowly (~15 s for the JVM and the first Python workers), so one session
serves the whole Spark suite. `local[2,2]`: two cores, and a failed task is retried once
(the sink's retry test relies on it). Every node a test starts is SIGKILLed at teardown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamwal.testing.local_node import LocalNode

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.* imports (the control plane, kube fixtures)
    sys.path.insert(0, str(ROOT))

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("streamwal-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopActiveRunOnRestart", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session  # format("streamwal") registers itself (the pyspark_streamwal module)
    session.stop()


class Nodes:
    """Starts LocalNodes under `root` and SIGKILLs every one of them at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[LocalNode] = []

    def __call__(self, name: str = "n1", *args: str, node_id: int = 1, data: Path | None = None):
        """A serving LocalNode; `data` reuses another node's data folder (a pod rescheduled
        with its volume, at a new address)."""
        node = LocalNode(data or self.root / name, node_id=node_id, extra_args=tuple(args))
        if data is not None:  # separate log and port files for the new process
            node.log_path = self.root / f"{name}.log"
            node.port_file = self.root / f"{name}.port"
        self.started.append(node)
        return node.start(timeout=60)

    def kill_all(self) -> None:
        for node in self.started:
            node.resume()
            node.kill()


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Nodes]:
    nodes = Nodes(tmp_path)
    yield nodes
    nodes.kill_all()


@pytest.fixture(scope="module")
def module_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Nodes shared by a module's tests (each test uses its own pchannels)."""
    nodes = Nodes(tmp_path_factory.mktemp("nodes"))
    yield nodes
    nodes.kill_all()
