"""The `streamwal` command line against a real node, run as a user would (subprocesses)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from base64 import b64decode
from pathlib import Path

import pytest

from streamwal.testing.local_node import LocalNode, free_port
from tests.support import readme_blocks

STREAMWAL = str(Path(sys.executable).parent / "streamwal")


def run(*args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [STREAMWAL, *args], input=stdin, capture_output=True, text=True, timeout=90
    )
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr[-2000:]}"
    return proc


def test_help() -> None:
    top = run("--help").stdout
    for command in ("node", "produce", "consume"):
        assert command in top
    node = run("node", "--help").stdout
    for flag in (
        "--listen",
        "--data-dir",
        "--metrics",
        "--node-id",
        "--durability",
        "--max-message-size",
        "--time-tick-interval",
        "--retention-check-interval",
        "--port-file",
    ):
        assert flag in node, flag
    assert "--progress" in run("produce", "--help").stdout
    assert "--vchannel" in run("consume", "--help").stdout


def test_node_without_data_dir_is_a_usage_error() -> None:
    proc = run("node", ok=False)
    assert proc.returncode == 2 and "--data-dir" in proc.stderr


def test_produce_and_consume(node: LocalNode) -> None:
    addr = ["--node", node.address, "--pchannel", "cli", "--term", "1"]
    proc = run("produce", *addr, "--assign", "--count", "5000", "--size", "64", "--progress")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["messages"] == 5000
    # Dense offsets. No idle TimeTick precedes them: ticks are written only while a
    # consumer takes them (the last read below, `--time-ticks`, gets one after `c`).
    first = summary["first_offset"]
    assert summary["last_offset"] == first + 4999
    assert summary["msgs_per_s"] > 0
    assert "5000/5000" in proc.stderr  # the progress bar
    lines = run("produce", *addr, "--vchannel", "cli_v1", "--no-progress", stdin="a\nb\nc\n")
    summary = json.loads(lines.stdout.strip().splitlines()[-1])
    assert summary["messages"] == 3 and summary["first_offset"] >= first + 5000
    start = summary["first_offset"]

    out = run("consume", *addr, "--count", "5003", "--show-internal").stdout.splitlines()
    msgs = [json.loads(line) for line in out]
    assert len(msgs) == 5003
    assert [b64decode(m["payload"]) for m in msgs[-3:]] == [b"a", b"b", b"c"]
    assert b64decode(msgs[0]["payload"]) == b"x" * 64 and msgs[0]["offset"] == first
    assert all(m["properties"]["_vc"] == "cli_v1" for m in msgs[-3:])
    assert all(
        m["properties"]["_wt"] == "1" and int(m["properties"]["_tt"]) == m["time_tick"]
        for m in msgs
    )
    # Without --show-internal the system's properties stay out of the way.
    hidden = json.loads(run("consume", *addr, "--from", str(first), "--count", "1").stdout)
    assert hidden["properties"] == {} and hidden["key"] is None
    offsets = [m["offset"] for m in msgs]
    assert offsets == sorted(offsets)

    raw = run("consume", *addr, "--from", str(start), "--count", "3", "--format", "raw")
    assert raw.stdout == "a\nb\nc\n"
    after = run("consume", *addr, "--after", str(start), "--count", "2", "--format", "raw")
    assert after.stdout == "b\nc\n"
    vc = run("consume", *addr, "--vchannel", "cli_v1", "--count", "3", "--format", "raw")
    assert vc.stdout == "a\nb\nc\n"
    ticks = run("consume", *addr, "--from", str(start), "--count", "4", "--time-ticks")
    assert len(ticks.stdout.splitlines()) == 4


def test_cli_errors_are_clear(node: LocalNode) -> None:
    proc = run("produce", "--node", node.address, "--pchannel", "nope", "--term", "1",
               "--count", "1", ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert "CHANNEL_NOT_EXIST" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("consume", "--node", node.address, "--pchannel", "nope", "--term", "1",
               "--count", "1", ok=False)  # fmt: skip
    assert proc.returncode != 0 and "CHANNEL_NOT_EXIST" in proc.stderr
    proc = run("consume", "--node", node.address, "--pchannel", "x", "--term", "1",
               "--from", "soon", ok=False)  # fmt: skip
    assert proc.returncode == 2 and "earliest, latest or an offset" in proc.stderr


def test_sync_client(node: LocalNode) -> None:
    sync = pytest.importorskip("streamwal.client.sync")
    client = sync.SyncNodeClient(node.address)
    try:
        client.assign("sync", 1)
        with client.producer("sync", 1) as producer:
            first = producer.send(b"one", vchannel="sync_v1")
            rest = producer.send_many([b"two", b"three"])
        assert [r.offset for r in rest] == [first.offset + 1, first.offset + 2]
        consumer = client.consumer("sync", 1, timeout=10)
        got = []  # no time ticks: the node tier's default, as the routed consumers'
        for m in consumer:
            got.append(m)
            if len(got) == 3:
                break
        assert [m.payload for m in got] == [b"one", b"two", b"three"]
        assert got[0].vchannel == "sync_v1"
    finally:
        client.close()


def test_the_readme_node_by_hand_section(tmp_path: Path) -> None:
    """README's "A node by hand", as a user runs it from the checkout: the node started in
    the background (its ports, data dir and the virtualenv's path swapped for the test's),
    produce, consume and the metrics read with curl; then its Python program, pasted into
    a file, twice: complete (no top-level await) and repeatable."""
    ((sh, commands), (python, program)) = readme_blocks("node-by-hand")
    assert (sh, python) == ("sh", "python")
    port, metrics = free_port(), free_port()
    swaps = {
        "127.0.0.1:19530": f"127.0.0.1:{port}",
        "127.0.0.1:9091": f"127.0.0.1:{metrics}",
        "/tmp/sw": str(tmp_path / "sw"),
        ".venv/bin/": f"{Path(sys.executable).parent}/",
    }
    for old, new in swaps.items():
        assert old in commands + program, old
        commands, program = commands.replace(old, new), program.replace(old, new)
    first, *rest = commands.splitlines()
    assert first.endswith(" &"), first
    node = subprocess.Popen(["bash", "-c", f"exec {first[:-2]}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):  # the user types the next command once it is up
            assert node.poll() is None and time.monotonic() < deadline, "node did not start"
            time.sleep(0.05)
        out = []
        for command in rest:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command],
                                  capture_output=True, text=True, timeout=90)  # fmt: skip
            assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
            out.append(done.stdout)
        produced, consumed, scraped = out
        assert json.loads(produced.splitlines()[-1])["messages"] == 10000
        assert len([json.loads(line) for line in consumed.splitlines()]) == 3
        assert 'streamwal_appended_messages_total{pchannel="ch-0"} 10000.0' in scraped
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip().endswith("b'hello'")
    finally:
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
