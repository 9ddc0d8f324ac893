"""`streamwal.client.connect()` against a coord that is not there: one clear error, and
nothing left behind on the client's loop (it used to print ~48 lines of "Task was
destroyed but it is pending!" at exit: the portal stopped its loop with gRPC's stream
tasks still pending)."""

from __future__ import annotations

import subprocess
import sys

from streamwal.testing.local_cluster import free_port

SCRIPT = """
import streamwal.client as client
from streamwal.errors import Unavailable
try:
    client.connect(coord="127.0.0.1:{port}", timeout=1.5)
except Unavailable as err:
    print("refused:", err)
"""


def test_a_down_coord_is_one_error_and_no_leaked_task() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(port=free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "is the coord running?" in done.stdout
    assert "Task was destroyed" not in done.stderr and done.stderr == "", done.stderr
