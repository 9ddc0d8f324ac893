"""`streamwal broadcast list` shows a broadcast holding its resource key, `streamwal
broadcast ack ID` releases it: a key left held (a consumer gone before acking, an example
that stopped halfway) is no longer stuck for good."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamwal.client import ResourceKey, connect
from streamwal.errors import ResourceKeyConflict

STREAMWAL = str(Path(sys.executable).parent / "streamwal")


def _cli(coord: str, *args: str) -> str:
    done = subprocess.run(
        [STREAMWAL, *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "STREAMWAL_COORD": coord},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.asyncio(loop_scope="module")
async def test_a_held_key_is_listed_and_released_by_hand(cluster) -> None:
    coord = cluster.coord_address
    key = ResourceKey("collection", "cli-held")
    targets = [f"{p}_vb" for p in cluster.pchannels[:2]]

    def held() -> int:
        with connect(coord=coord) as wal:
            return wal.broadcast().append(b"drop", targets, [key]).broadcast_id

    bid = await asyncio.to_thread(held)
    rows = [line.split() for line in _cli(coord, "broadcast", "list").splitlines()]
    mine = [r for r in rows[1:] if r[0] == str(bid)]
    assert mine and mine[0][1] == "done" and mine[0][2] == "collection:cli-held", rows
    assert mine[0][3] == ",".join(sorted(targets))

    def again() -> None:
        with connect(coord=coord) as wal:
            wal.broadcast().append(b"drop again", targets, [key])

    with pytest.raises(ResourceKeyConflict):
        await asyncio.to_thread(again)
    assert f"acked on {len(targets)} vchannel(s)" in _cli(coord, "broadcast", "ack", str(bid))
    ids = [line.split()[0] for line in _cli(coord, "broadcast", "list").splitlines()[1:]]
    assert str(bid) not in ids  # acked everywhere: no longer holding its key
    assert str(bid) in _cli(coord, "broadcast", "list", "--all")

    def released() -> None:
        with connect(coord=coord) as wal:
            bc = wal.broadcast()
            bc.block_until_resource_key_ack_all(key, timeout=10)
            result = bc.append(b"recreate", targets, [key])
            for v in targets:
                bc.ack(result.broadcast_id, v)

    await asyncio.to_thread(released)
