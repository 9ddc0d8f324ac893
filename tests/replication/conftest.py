"""Fixtures for the replication tests: the node suite's real node processes (SIGKILLed at
teardown, logs printed on failure), fresh pchannel names, and three nodes with clients."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from streamwal.client.node_client import NodeClient  # noqa: E402
from tests.node.conftest import (  # noqa: E402,F401  (fixtures and the report hook)
    node_dir,
    pchannel,
    pytest_runtest_makereport,
    start_node,
)


@pytest.fixture
async def trio(start_node):  # noqa: F811  (the imported fixture)
    """Three nodes (ids 1, 2, 3) and a client for each, by node id."""
    nodes = [start_node(f"n{i}", node_id=i) for i in (1, 2, 3)]
    clients = {n.node_id: NodeClient(n.address) for n in nodes}
    for c in clients.values():
        await c.wait_ready(30)
    yield nodes, clients
    for c in clients.values():
        await c.close()
