"""The README's getting-started section, run command by command in a fresh shell.

The commands are read from the README (between its getting-started markers), not copied
here, so the section cannot drift from what works. Each runs under `bash -c` with an
environment holding only PATH (the virtualenv's `streamwal` first), HOME, and the coord
address the README says to export when `dev --serve` listens elsewhere than the default
(STREAMWAL_DEV_LISTEN is `--listen`; a free port keeps parallel runs apart). The one
placeholder, `<pid of that node>`, is filled in as a reader would: the NODE column of the
`channel describe` just printed, and that node's pid from the `dev --serve` banner.
`consume` follows the channel forever: it is read until every produced message is out,
then stopped with SIGTERM (which must lose no printed line and exit 0).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from streamwal.testing.local_cluster import free_port
from tests.support import readme_blocks

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BOUND_S = 60.0


def _commands() -> list[str]:
    blocks = readme_blocks("getting-started")
    assert {kind for kind, _ in blocks} == {"sh"}, blocks
    return [line.strip() for _, block in blocks for line in block.splitlines() if line.strip()]


class Lines:
    """A child's stdout lines, read by a thread so that every wait for one is bounded."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put("")

    def next(self, deadline: float, end_ok: bool = False) -> str:
        """The next line; "" at the end of the output (an error unless `end_ok`)."""
        try:
            line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no line within the bound") from None
        assert line or end_ok, f"exited early ({self.proc.poll()})"
        return line

    def rest(self) -> str:
        """Everything until the end of the output (the child has exited)."""
        return "".join(iter(lambda: self.next(time.monotonic() + 10, end_ok=True), ""))


def test_readme_getting_started(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STREAMWAL_DEV_LISTEN": address,
        "STREAMWAL_COORD": address,
    }
    commands = _commands()
    assert commands[0] == "streamwal dev --serve", commands
    dev = subprocess.Popen(
        ["bash", "-c", commands[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + BOUND_S
        dev_lines = Lines(dev)
        banner: list[str] = []
        while not banner or not banner[-1].startswith("Try"):
            banner.append(dev_lines.next(deadline))
        pids = {
            int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"node (\d+)\s+\S+\s+pid (\d+)", "".join(banner))
        }
        assert len(pids) == 3 and address in "".join(banner), banner
        expected: list[tuple[str, str]] = []
        consumed: list[list[str]] = []
        last_out = ""
        for command in commands[1:]:
            if "<pid of that node>" in command:
                table = [line.split() for line in last_out.splitlines()]
                owner = int(table[1][table[0].index("NODE")])
                command = command.replace("<pid of that node>", str(pids[owner]))
                subprocess.run(["bash", "-c", command], env=env, check=True, timeout=30)
            elif command.startswith("streamwal consume"):
                consumed.append(_consume(command, env, len(expected), tmp_path))
            else:
                done = subprocess.run(
                    ["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True,
                    text=True, timeout=BOUND_S,
                )  # fmt: skip
                assert done.returncode == 0, f"{command}: {done.stderr}"
                last_out = done.stdout
                if "| streamwal produce" in command:
                    expected = _lines_sent(command, env)
                    assert json.loads(done.stdout)["messages"] == len(expected)
        assert len(expected) == 3 and len(consumed) == 2
        for lines in consumed:
            got = [json.loads(line) for line in lines]
            pairs = [(m["key"], base64.b64decode(m["payload"]).decode()) for m in got]
            assert pairs == expected  # every message, in order
        assert consumed[0] == consumed[1]  # the same offsets and ticks after the failover
        # The README's client program, pasted into a file, runs as is (twice in a row).
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-c", _readme_client_program()], env=env, cwd=tmp_path,
                capture_output=True, text=True, timeout=BOUND_S,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "b'2 pens'" in done.stdout and "b'hello'" in done.stdout
    finally:
        if dev.poll() is None:
            dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(30)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait(10)
    err = dev.stderr.read()
    assert dev.returncode == 0, err[-2000:]
    out = dev_lines.rest()
    assert "streamwal dev: stopped" in out and "Traceback" not in err
    assert re.search(r"node \d stopped \(signal 9\)", out), out  # the owner was killed


def _readme_client_program() -> str:
    """The README's Python program on the client face (`from streamwal.client import`)."""
    ((kind, program),) = readme_blocks("client-program")
    assert kind == "python"
    return program


def _lines_sent(command: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """(key, payload) of what the README's `printf ... | streamwal produce` sends."""
    source = command.split("|")[0]
    separator = command.split("--key-separator")[1].split()[0]
    text = subprocess.run(["bash", "-c", source], env=env, capture_output=True, text=True).stdout
    return [tuple(line.split(separator, 1)) for line in text.splitlines()]  # type: ignore[misc]


def _consume(command: str, env: dict[str, str], count: int, cwd: Path) -> list[str]:
    """Run a following `consume` until `count` lines are out, then SIGTERM it."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=cwd,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + BOUND_S
        reader = Lines(proc)
        lines = [reader.next(deadline) for _ in range(count)]
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        rest = reader.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 and rest == "", (proc.returncode, rest, proc.stderr.read())
    return [line.rstrip("\n") for line in lines]


def test_dev_serve_refuses_demo_options() -> None:
    proc = subprocess.run(
        [str(BIN / "streamwal"), "dev", "--serve", "--messages", "50"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert proc.returncode == 2 and "--messages: demo options" in proc.stderr
