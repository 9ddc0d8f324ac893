"""Every bad flag or environment value is one line and exit status 2, never a traceback.

They used to end in tracebacks (a size or duration that does not parse, a node list, an
offset below 0, a zero interval), or to be taken silently: `--listen :99999` bound port
34463 and `--time-tick-interval 0` spun a core. Run in-process (click's runner) but for
the last two, which run the command as a user does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from streamwal.cli import main

STREAMWAL = str(Path(sys.executable).parent / "streamwal")
NODE = ("node", "--data-dir", "/tmp/streamwal-flags-never-created")
COORD = ("coord", "--meta-dir", "/tmp/streamwal-flags-never-created", "--nodes", "1=h:1")
PRODUCE = ("produce", "--node", "127.0.0.1:1", "--pchannel", "p", "--term", "1")
CONSUME = ("consume", "--node", "127.0.0.1:1", "--pchannel", "p", "--term", "1")

CASES = {
    # streamwal node
    "size": ((*NODE, "--max-message-size", "abc"), "not a size"),
    "duration": ((*NODE, "--time-tick-interval", "xyz"), "not a duration"),
    "zero-tick": ((*NODE, "--time-tick-interval", "0"), "at least 0.01s"),
    "zero-retention-check": ((*NODE, "--retention-check-interval", "0"), "at least 0.1s"),
    "negative-duration": ((*NODE, "--retention-age", "-5"), "not a duration"),
    "port-range": ((*NODE, "--listen", "127.0.0.1:99999"), "a port 0..65535"),
    "no-host": ((*NODE, "--listen", ":19530"), "with a host"),
    "no-port": ((*NODE, "--listen", "nonsense"), "not HOST:PORT"),
    "metrics": ((*NODE, "--metrics", "abc"), "'--metrics'"),
    "produce-listen": ((*NODE, "--produce-listen", "foo"), "'--produce-listen'"),
    "replication-listen": ((*NODE, "--replication-listen", "foo"), "'--replication-listen'"),
    "zero-window": ((*NODE, "--producer-window", "0"), "at least 64KiB"),
    "negative-count": ((*NODE, "--txn-max-open", "-1"), "not in the range"),
    "node-id": ((*NODE, "--node-id", "-3"), "not in the range"),
    "log-level": ((*NODE, "--log-level", "foo"), "is not one of"),
    "frame-below-message": ((*NODE, "--max-frame-size", "4MiB"), "--max-message-size"),
    "keepalive-over-max": ((*NODE, "--txn-keepalive", "1h"), "--txn-max-keepalive"),
    "port-file-folder": ((*NODE, "--port-file", "/nonexistent/port"), "does not exist"),
    # streamwal coord and channel
    "node-list": (("coord", "--meta-dir", "/tmp/x", "--nodes", "abc"), "ID=HOST:PORT"),
    "node-port": (
        ("coord", "--meta-dir", "/tmp/x", "--nodes", "1=h:99999"),
        "node 1: 'h:99999'",
    ),
    "zero-probe": ((*COORD, "--probe-interval", "0"), "not in the range"),
    "negative-grace": ((*COORD, "--grace", "-1"), "not in the range"),
    "coord-metrics": ((*COORD, "--metrics", "x:y"), "'--metrics'"),
    "negative-moves": ((*COORD, "--max-moves", "-1"), "not in the range"),
    "zero-rebalance": ((*COORD, "--rebalance-interval", "0"), "not in the range"),
    "coord-listen": ((*COORD, "--listen", ":99999"), "'--listen'"),
    "channel-count": (("channel", "create", "--count", "-1"), "not in the range"),
    "even-replicas": (("channel", "create", "--replicas", "2"), "2 is even"),
    "coord-address": (("channel", "describe", "--coord", "nonsense"), "'--coord'"),
    # streamwal produce and consume
    "node-address": (("produce", "--node", "x", "--pchannel", "p", "--term", "1"), "'--node'"),
    "zero-term": (
        ("produce", "--node", "127.0.0.1:1", "--pchannel", "p", "--term", "0"),
        "not in the range",
    ),
    "zero-batch": ((*PRODUCE, "--batch", "0"), "not in the range"),
    "negative-size": ((*PRODUCE, "--size", "-1"), "not in the range"),
    "negative-from": ((*CONSUME, "--from", "-5"), "use earliest, latest or an offset"),
    "negative-after": ((*CONSUME, "--after", "-5"), "not in the range"),
    "negative-tick": ((*CONSUME, "--tick-gt", "-1"), "not in the range"),
    # streamwal operator
    "operator-listen": (("operator", "--coord-listen", ":99999"), "'--coord-listen'"),
    "operator-probe": (("operator", "--probe-interval", "0"), "not in the range"),
    "liveness-url": (("operator", "--liveness", "foo"), "not an http(s)"),
    "namespace": (("operator", "--namespace", "Bad_NS"), "DNS-1123 label"),
}


@pytest.mark.parametrize(("args", "text"), CASES.values(), ids=CASES.keys())
def test_a_bad_flag_is_one_line_and_exit_status_2(args: tuple[str, ...], text: str) -> None:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and text in last, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ({"STREAMWAL_NODE_MAX_CONNECTIONS": "0"}, "'--max-connections': 0 is not in the range"),
        ({"STREAMWAL_NODE_LISTEN": "127.0.0.1:70000"}, "'--listen'"),
        ({"STREAMWAL_LOG_FORMAT": "xml"}, "STREAMWAL_LOG_FORMAT='xml': use one of json, text"),
    ],
    ids=["count", "port", "log-format"],
)
def test_a_bad_environment_value_is_refused_like_a_flag(env: dict[str, str], text: str) -> None:
    result = CliRunner().invoke(main, list(NODE), env=env)
    assert result.exit_code == 2 and text in result.output, result.output


def test_the_command_itself_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [STREAMWAL, "node", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:99999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: Invalid value for '--listen'")
    assert "Traceback" not in proc.stderr


def test_an_address_in_use_is_one_line(tmp_path: Path, node) -> None:
    """Not a bad value, but a start-up failure: one line naming the flag and the cause."""
    proc = subprocess.run(
        [STREAMWAL, "node", "--data-dir", str(tmp_path), "--listen", node.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"Error: cannot listen on {node.address} (--listen): Address already in use"]
