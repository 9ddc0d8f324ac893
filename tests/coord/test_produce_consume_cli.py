"""`streamwal produce CHANNEL` / `streamwal consume CHANNEL` through a real coord: keys and
properties from stdin, JSON/text output with internal properties hidden, Kafka's
`latest`, line-by-line output that survives SIGTERM, a typo'd channel refused at once,
and `--assign` refused on a channel the coord manages."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time

import pytest

from tests.coord.conftest import STREAMWAL
from tests.support import wait_for


def run(cluster, *args: str, stdin: str | None = None, ok: bool = True):
    proc = subprocess.run(
        [STREAMWAL, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STREAMWAL_COORD": cluster.coord_address},
    )
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr[-2000:]}"
    return proc


async def test_produce_and_consume_by_name(cluster):
    for i in (1, 2):
        await cluster.start_node(i)
    await cluster.start_coord([1, 2])
    run(cluster, "channel", "create", "orders")
    await wait_for(lambda: cluster.all_assigned(["orders"]), 10, what="placement")

    lines = "".join(f"k{i % 3}:order {i}\n" for i in range(20))
    summary = json.loads(
        run(
            cluster,
            "produce",
            "orders",
            "--key-separator",
            ":",
            "--property",
            "src=cli",
            "--no-progress",
            stdin=lines,
        ).stdout
    )
    assert summary["messages"] == 20
    out = run(cluster, "consume", "orders", "--format", "json", "--count", "20").stdout
    got = [json.loads(line) for line in out.splitlines()]
    assert [(m["key"], base64.b64decode(m["payload"]).decode()) for m in got] == [
        (f"k{i % 3}", f"order {i}") for i in range(20)
    ]
    assert all(m["properties"] == {"src": "cli"} and m["channel"] == "orders" for m in got)
    assert [m["offset"] for m in got] == list(
        range(summary["first_offset"], summary["last_offset"] + 1)
    )
    shown = json.loads(run(cluster, "consume", "orders", "--count", "1", "--show-internal").stdout)
    assert {"_tt", "_wt", "_key"} <= set(shown["properties"])
    text = run(cluster, "consume", "orders", "--format", "text", "--count", "2").stdout
    assert text.splitlines()[1].split("\t")[1:] == ["k1", "order 1"]

    # Binary payloads survive the round trip through JSON lines.
    blob = bytes(range(256))
    json_in = json.dumps({"payload": base64.b64encode(blob).decode(), "key": "bin"}) + "\n"
    run(cluster, "produce", "orders", "--input", "json", "--no-progress", stdin=json_in)

    # A line without the separator, a reserved property, a typo'd channel: one line, exit 1/2.
    bad = run(cluster, "produce", "orders", "--key-separator", ":", stdin="nokey\n", ok=False)
    assert bad.returncode == 1 and "line 1: no key separator" in bad.stderr
    reserved = run(cluster, "produce", "orders", "--property", "_tt=1", stdin="", ok=False)
    assert reserved.returncode == 2 and "reserved" in reserved.stderr
    started = time.monotonic()
    typo = run(cluster, "consume", "ordres", ok=False)
    assert typo.returncode == 1 and "no such channel: 'ordres'" in typo.stderr
    assert time.monotonic() - started < 10 and len(typo.stderr.splitlines()) == 1

    # --assign on a channel the coord manages is refused, nothing is assigned.
    d = (await cluster.describe())["orders"]
    refused = run(cluster, "produce", "orders", "--node", d.meta.node.address, "--term",
                  str(d.meta.channel.term + 1), "--assign", "--count", "1", ok=False)  # fmt: skip
    assert refused.returncode == 1 and "--assign refused" in refused.stderr
    assert (await cluster.describe())["orders"].meta.channel.term == d.meta.channel.term

    # Following: each line is out as soon as it is consumed; `latest` is only what comes
    # after the start (Kafka's meaning); SIGTERM ends it cleanly with every line printed.
    follower = subprocess.Popen(
        [STREAMWAL, "consume", "orders", "--from", "latest", "--format", "raw"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "STREAMWAL_COORD": cluster.coord_address},
    )
    try:
        await asyncio.sleep(2.0)  # it has connected and opened at the end
        run(cluster, "produce", "orders", "--no-progress", stdin="new 1\nnew 2\n")
        first = await asyncio.wait_for(asyncio.to_thread(follower.stdout.readline), 20)
        assert first == b"new 1\n"  # flushed at once, not at exit
        second = await asyncio.wait_for(asyncio.to_thread(follower.stdout.readline), 20)
        assert second == b"new 2\n"
        follower.send_signal(signal.SIGTERM)
        rest, err = await asyncio.wait_for(asyncio.to_thread(follower.communicate), 20)
        assert follower.returncode == 0, err
        assert rest == b"" and b"Traceback" not in err
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)


@pytest.mark.parametrize("variable", ["STREAMWAL_CONSUME_FROM", "STREAMWAL_CONSUME_FORMAT"])
def test_consume_variables_are_the_options(variable):
    """STREAMWAL_<COMMAND>_<OPTION> is read for the option it names (it used to be
    STREAMWAL_CONSUME_START for --from) and `--help` names it."""
    help_text = subprocess.run(
        [STREAMWAL, "consume", "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    assert variable in help_text
    proc = subprocess.run(
        [STREAMWAL, "consume", "orders", "--coord", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, variable: "nonsense"},
    )
    assert proc.returncode == 2 and "nonsense" in proc.stderr, proc.stderr
