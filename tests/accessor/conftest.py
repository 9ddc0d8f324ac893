"""Real-process fixtures for the accessor tests: a coord and nodes (LocalCluster).

`cluster` is shared by the tests of one module (they use distinct vchannels, so they do
not see each other's messages) and runs on the module's event loop; tests that kill a
node start their own with `make_cluster`. Every process is SIGKILLed at teardown.
"""

from __future__ import annotations

import pytest_asyncio

from streamwal.testing.local_cluster import LocalCluster
from tests.routing.conftest import make_cluster  # noqa: F401  (a test's own cluster)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    """Two nodes and three pchannels, shared by a module's tests."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=2, log_level="warning")
    try:
        await c.start()
        c.pchannels = await c.create_channels(3)
        yield c
    finally:
        await c.close()
