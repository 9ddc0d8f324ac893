"""Reading every replica's copy of a pchannel from running nodes, for `history.check`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from streamwal.node.peer import fetch
from streamwal.testing.history import Log, parse_log


async def read_replica(node: int, address: str, pchannel: str) -> Log:
    """Everything `node` stores of `pchannel`, read through Fetch (any role, any fence)."""
    got = []
    async for response in fetch(address, pchannel, 0, timeout=60):
        if response.record:
            got.append((response.base_offset, response.record))
    return parse_log(f"node {node}", got)


async def read_replicas(
    members: Mapping[int, str], pchannel: str, timeout: float = 30.0
) -> dict[int, Log]:
    """Every member's log (node -> address), read together until their ends agree.

    A leader appends idle time ticks, so logs read one after another rarely end alike;
    reads repeat (bounded) until one snapshot does. After `timeout` the last snapshot is
    returned and `check` reports the differing ends."""
    deadline = time.monotonic() + timeout
    while True:
        read = await asyncio.gather(*(read_replica(n, a, pchannel) for n, a in members.items()))
        logs = dict(zip(members, read, strict=True))
        if len({log.end for log in read}) == 1 or time.monotonic() > deadline:
            return logs
        await asyncio.sleep(0.2)
