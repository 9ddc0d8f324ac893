"""`streamwal channel create NAME / list / describe` and `streamwal node list / drain`
against a real coord and real nodes: what an operator types, checked on what it prints."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import urllib.request

import pytest

from streamwal.client.node_client import NodeClient
from tests.coord.conftest import STREAMWAL
from tests.support import wait_for


def _rows(table: str) -> dict[str, dict[str, str]]:
    """A printed table as {first column: {header: cell}} (REPLICAS' `3: ` joined)."""
    lines = table.replace(": ", ":").splitlines()
    header = lines[0].split()
    return {line.split()[0]: dict(zip(header, line.split(), strict=True)) for line in lines[1:]}


async def test_named_channels_listed_described_and_nodes_drained(cluster, monkeypatch):
    metrics = {}
    for i in (1, 2):
        metrics[i] = f"127.0.0.1:{cluster.free_port()}"
        monkeypatch.setenv("STREAMWAL_NODE_METRICS", metrics[i])
        await cluster.start_node(i)
    monkeypatch.delenv("STREAMWAL_NODE_METRICS")
    await cluster.start_coord([1, 2], "--rebalance-interval", "0.5")
    coord = ("--coord", cluster.coord_address)

    out = await cluster.cli("channel", "create", *coord, "orders", "--retention", "7d")
    assert out.split() == ["orders"]
    # Milvus-style names work; the numbered form stays.
    assert (await cluster.cli("channel", "create", *coord, "by-dev-rootcoord-dml_0")).split() == [
        "by-dev-rootcoord-dml_0"
    ]
    assert (await cluster.cli("channel", "create", *coord, "--prefix", "p")).split() == ["p_0"]
    for bad, why in (
        (("orders",), "already exists"),
        (("a/b",), "invalid pchannel name"),
        (("x", "--count", "2"), "not both"),
    ):
        with pytest.raises(AssertionError, match=why):
            await cluster.cli("channel", "create", *coord, *bad)

    described = await wait_for(
        lambda: cluster.all_assigned(["orders", "by-dev-rootcoord-dml_0", "p_0"]),
        10,
        what="placement",
    )
    owner = described["orders"].meta.node.server_id
    term = described["orders"].meta.channel.term
    async with NodeClient(cluster.node_address(owner)) as nc:
        producer = await nc.producer("orders", term)
        await producer.send_many([b"a", b"b", b"c"])
        await producer.close()

    async def offsets_shown():
        rows = _rows(await cluster.cli("channel", "list", *coord))
        last = rows["orders"]["LAST"]
        return rows if last != "-" and int(last) >= 2 else None

    # The coord hears the leader's report within a probe interval or two. Offsets count
    # the node's time ticks too (the log's own), so LAST is at least the third message.
    rows = await wait_for(offsets_shown, 10, what="offsets in channel list")
    assert set(rows) == {"orders", "by-dev-rootcoord-dml_0", "p_0"}
    orders = rows["orders"]
    assert (orders["OWNER"], orders["STATE"], orders["TERM"]) == ("cli", "ASSIGNED", str(term))
    assert orders["FIRST"] == "0" and orders["REPLICAS"].startswith(f"1:{owner}*@")

    # describe: one replica still shows the leader and its log end, and the retention.
    described_text = await cluster.cli("channel", "describe", *coord, "orders")
    row = _rows(described_text)["orders"]
    assert row["REPLICAS"] == f"1:{owner}*@{int(row['LAST']) + 1}", described_text
    assert (row["FIRST"], row["RETENTION"]) == ("0", "7d") and int(row["LAST"]) >= 2
    # ... and the owner applies it (the Assign carried it).
    age = await asyncio.to_thread(_retention_age, metrics[owner], "orders")
    assert age == 7 * 86_400

    # STREAMWAL_COORD is every command's coord when no flag says otherwise.
    env_out = await asyncio.to_thread(
        _run_env, ("channel", "list"), {"STREAMWAL_COORD": cluster.coord_address}
    )
    assert "orders" in env_out

    # node list, then drain the owner: the channel moves to the other node.
    nodes = _rows(await cluster.cli("node", "list", *coord))
    assert set(nodes) == {"1", "2"} and nodes[str(owner)]["LIVENESS"] == "live"
    await cluster.cli("node", "drain", *coord, str(owner))
    other = 3 - owner
    await wait_for(lambda: cluster.all_assigned(list(rows), avoid={owner}), 30, what="drained away")
    nodes = _rows(await cluster.cli("node", "list", *coord))
    assert nodes[str(owner)]["DRAINED"] == "yes" and nodes[str(other)]["CHANNELS"] == "3"
    await cluster.cli("node", "undrain", *coord, str(owner))
    assert _rows(await cluster.cli("node", "list", *coord))[str(owner)]["DRAINED"] == "no"


def _retention_age(address: str, pchannel: str) -> float | None:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    m = re.search(
        rf'^streamwal_pchannel_retention_age_seconds{{pchannel="{pchannel}"}} (\S+)$',
        text,
        re.MULTILINE,
    )
    return float(m.group(1)) if m else None


def _run_env(args: tuple[str, ...], env: dict[str, str]) -> str:
    done = subprocess.run(
        [STREAMWAL, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_coord_says_in_one_line_why_it_cannot_start(tmp_path) -> None:
    """A port in use (its listener or --metrics) or an unusable meta dir: one line naming
    the flag and the cause, exit 1 -- not a traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        meta = str(tmp_path / "meta")
        for args, line in (
            (["--listen", busy, "--meta-dir", meta], f"cannot listen on {busy} (--listen)"),
            (["--meta-dir", meta, "--metrics", busy], f"cannot listen on {busy} (--metrics)"),
            (["--meta-dir", "/proc/none/meta"], "cannot use the meta dir /proc/none/meta"),
        ):
            proc = subprocess.run(
                [STREAMWAL, "coord", "--nodes", "1=127.0.0.1:1", "--listen", "127.0.0.1:0", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1, proc.stderr
            assert lines[0].startswith(f"Error: {line}"), lines
