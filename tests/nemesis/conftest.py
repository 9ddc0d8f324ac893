"""The nemesis suite's harness: a seeded random source per test, clusters whose nodes can
sit on fault-injecting disks, in network namespaces or on a shifted clock, and a clean-up
stack that unmounts and deletes whatever a test set up, also when it fails.

Seeds: every test draws its choices (victims, timings, schedule) from
``random.Random("<seed>:<test id>")``; the seed is random unless given by
``--nemesis-seed N`` or ``STREAMWAL_NEMESIS_SEED=N``, and a failing test prints it with the
command that replays it. The long schedule: ``--nemesis-long`` or ``STREAMWAL_NEMESIS_LONG=1``
(the options exist when pytest is pointed at tests/nemesis; the variables always work).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.nemesis import faults  # noqa: E402
from tests.nemesis.cluster import NemesisCluster  # noqa: E402

_SESSION_SEED = int(time.time() * 1000) % 1_000_000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemesis")
    group.addoption("--nemesis-seed", type=int, help="replay the nemesis suite's choices")
    group.addoption("--nemesis-long", action="store_true", help="the long nemesis schedule")


def _option(config: pytest.Config, name: str):
    with contextlib.suppress(ValueError):
        return config.getoption(name)
    return None


@pytest.fixture(scope="session")
def nemesis_seed(pytestconfig: pytest.Config) -> int:
    given = _option(pytestconfig, "--nemesis-seed")
    if given is None and os.environ.get("STREAMWAL_NEMESIS_SEED"):
        given = int(os.environ["STREAMWAL_NEMESIS_SEED"])
    return _SESSION_SEED if given is None else given


@pytest.fixture(scope="session")
def nemesis_long(pytestconfig: pytest.Config) -> bool:
    return bool(_option(pytestconfig, "--nemesis-long")) or os.environ.get(
        "STREAMWAL_NEMESIS_LONG", ""
    ) not in ("", "0")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    seed = getattr(item, "nemesis_seed", None)
    if report.failed and seed is not None:
        report.sections.append(
            (
                "nemesis seed",
                f"seed {seed}; replay: pytest '{item.nodeid}' --nemesis-seed {seed} "
                f"(or STREAMWAL_NEMESIS_SEED={seed})",
            )
        )
    return report


def require_tools() -> None:
    missing = [
        t for t in ("fusermount3", "iptables", "faketime", "mkfs.ext4") if not shutil.which(t)
    ]
    if missing or os.geteuid() != 0:
        pytest.fail(
            f"the nemesis suite needs root and {', '.join(missing) or 'its tools'}: "
            "run scripts/setup --test",
            pytrace=False,
        )


class Harness:
    """What a nemesis test gets: its random source, its directory, and constructors for
    clusters and injectors that are undone at teardown (processes first, then mounts and
    namespaces)."""

    def __init__(self, root: Path, seed: int, rng: random.Random, long: bool) -> None:
        self.root = root
        self.seed = seed
        self.rng = rng
        self.long = long
        self.cleanup = contextlib.ExitStack()
        self.clusters: list[NemesisCluster] = []

    def cluster(self, nodes: int = 3, **kwargs) -> NemesisCluster:
        cluster = NemesisCluster(self.root, nodes, **kwargs)
        self.clusters.append(cluster)
        self.cleanup.callback(cluster.kill_all)  # before the mounts it uses go
        return cluster

    def lazy_mount(self, mountpoint: Path) -> faults.LazyMount:
        workdir = self.root / f"lazyfs-{mountpoint.name}"
        mount = faults.LazyMount(mountpoint, workdir)
        self.cleanup.callback(mount.close)
        return mount.start()

    def network(self, hosts: int) -> faults.Network:
        network = faults.Network(hosts)
        self.cleanup.callback(network.close)
        return network.start()

    def tmpfs(self, mountpoint: Path, size: str = "64m") -> faults.Tmpfs:
        disk = faults.Tmpfs(mountpoint, size)
        self.cleanup.callback(disk.close)
        return disk.start()

    def ext4(self, mountpoint: Path, size: str = "128M") -> faults.Ext4Image:
        disk = faults.Ext4Image(mountpoint, self.root / f"{mountpoint.name}.ext4", size)
        self.cleanup.callback(disk.close)
        return disk.start()

    async def close(self, failed: bool) -> None:
        for cluster in self.clusters:
            if failed:
                print(cluster.logs_tail())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cluster.close(), 30)
        self.cleanup.close()


@pytest.fixture
async def nemesis(
    tmp_path: Path, request: pytest.FixtureRequest, nemesis_seed: int, nemesis_long: bool
) -> AsyncIterator[Harness]:
    require_tools()
    request.node.nemesis_seed = nemesis_seed
    rng = random.Random(f"{nemesis_seed}:{request.node.nodeid}")
    harness = Harness(tmp_path, nemesis_seed, rng, nemesis_long)
    try:
        yield harness
    finally:
        failed = getattr(request.node, "rep_call", None)
        await harness.close(failed is not None and failed.failed)
