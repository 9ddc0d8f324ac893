"""Real-process fixtures for routing tests: a LocalCluster (coord + nodes) per test.

Every process is SIGKILLed at teardown, also when the test fails; on failure the coord's
log tail is printed to help the reader.
"""

from __future__ import annotations

import pytest

from streamwal.testing.local_cluster import LocalCluster


@pytest.fixture
async def make_cluster(tmp_path):
    """`await make_cluster(nodes=3, grace=...)` -> a started LocalCluster."""
    started: list[LocalCluster] = []

    async def make(nodes: int = 3, grace: float = 1.5, **kwargs) -> LocalCluster:
        cluster = LocalCluster(
            tmp_path / f"c{len(started)}", nodes=nodes, grace=grace, log_level="warning", **kwargs
        )
        started.append(cluster)
        return await cluster.start()

    try:
        yield make
    finally:
        for cluster in started:
            await cluster.close()
