"""Helpers of the node replication tests: replica sets, raw logs via Fetch, waits."""

from __future__ import annotations

import asyncio
import json

from streamwal.client.node_client import NodeClient, replica_set
from streamwal.node.peer import fetch
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import LocalNode
from tests.support import wait_for


def members(nodes: list[LocalNode]) -> list[tuple[int, str]]:
    return [(n.node_id, n.address) for n in nodes]


async def assign_replicas(
    clients: dict[int, NodeClient], nodes: list[LocalNode], pch: str, term: int, leader: LocalNode
) -> None:
    """Assign `pch` at `term` on every node of `nodes` present in `clients`: `leader`
    leads, the others follow it."""
    ms = members(nodes)
    if leader.node_id in clients:
        await clients[leader.node_id].assign(pch, term, replica_set=replica_set(True, ms))
    for n in nodes:
        if n is not leader and n.node_id in clients:
            rs = replica_set(False, ms, (leader.node_id, leader.address))
            await clients[n.node_id].assign(pch, term, replica_set=rs)


async def raw_log(address: str, pch: str) -> list[tuple[int, bytes]]:
    """Every stored record (base offset, stored bytes) of `pch` on that node."""
    out = []
    async for resp in fetch(address, pch, 0, timeout=30):
        if resp.record:
            out.append((resp.base_offset, resp.record))
    return out


async def status(client: NodeClient, pch: str) -> pb.PChannelStatus | None:
    for s in (await client.collect_status()).channels:
        if s.pchannel.name == pch:
            return s
    return None


async def wait_identical(addresses: list[str], pch: str, timeout: float = 30.0) -> list:
    """Waits until every node holds the same records; returns them."""
    logs: list = []

    async def same() -> bool:
        nonlocal logs
        logs = await asyncio.gather(*(raw_log(a, pch) for a in addresses))
        return all(log == logs[0] for log in logs) and bool(logs[0])

    try:
        await wait_for(same, timeout, 0.2, "identical replica logs")
    except TimeoutError:
        ends = [log[-1][0] if log else None for log in logs]
        raise AssertionError(f"logs differ after {timeout}s: last bases {ends}") from None
    return logs[0]


async def fail_or_timeout(awaitable, seconds: float) -> str:
    """'timeout' if `awaitable` did not finish within `seconds`, else 'error: ...' or
    'done'."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        return "timeout"
    return f"error: {task.exception()}" if task.exception() else "done"


def follower_transports(leader: LocalNode, pch: str) -> dict[int, str]:
    """How each follower of `pch` last connected to `leader` ("port" or "grpc"), from the
    leader's log."""
    got = {}
    for line in leader.log_path.read_text(errors="replace").splitlines():
        if '"follower connected"' in line and f'"pchannel": "{pch}"' in line:
            said = json.loads(line)
            got[said["follower"]] = said["transport"]
    return got
