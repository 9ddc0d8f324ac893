"""Fixtures for the streaming-node tests: real node processes on loopback, and clients.

Every node a test starts is SIGKILLed at teardown (after SIGCONT, in case a test paused
it), also when the test fails; a failing test prints the tail of each node's log.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.testing.local_node import LocalNode

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # helpers are imported as tests.node.helpers
    sys.path.insert(0, str(ROOT))

_names = itertools.count(1)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


StartNode = Callable[..., LocalNode]


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    """Where `start_node` puts the nodes' data and logs (a module may override it)."""
    return tmp_path


@pytest.fixture
def start_node(node_dir: Path, request: pytest.FixtureRequest) -> Iterator[StartNode]:
    """start_node(name="n1", *args, node_id=1, env=None): a serving LocalNode with flags
    `args` (and STREAMWAL_NODE_* variables in `env`)."""
    nodes: list[LocalNode] = []

    def start(
        name: str = "n1", *args: str, node_id: int = 1, env: dict[str, str] | None = None
    ) -> LocalNode:
        node = LocalNode(node_dir / name, node_id=node_id, extra_args=tuple(args), env=env)
        nodes.append(node)
        return node.start(timeout=60)

    yield start
    failed = getattr(request.node, "rep_call", None)
    for node in nodes:
        node.resume()
        node.kill()
        if failed is not None and failed.failed:
            print(f"--- log of node {node.node_id} ({node.log_path}) ---\n{node.log_tail()}")


@pytest.fixture
def node(start_node: StartNode) -> LocalNode:
    return start_node()


@pytest.fixture
async def client(node: LocalNode) -> AsyncIterator[NodeClient]:
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        yield c


@pytest.fixture
def pchannel() -> str:
    """A fresh pchannel name per test."""
    return f"pch-{next(_names)}"


@pytest.fixture
async def bystander(client: NodeClient):
    """A caller on its own pchannel for the whole test (helpers.served_throughout)."""
    from tests.node.helpers import served_throughout

    async with served_throughout(client) as b:
        yield b
