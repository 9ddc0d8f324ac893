"""Run a streaming node as a local child process: tests, benchmarks and the demo use it.

Its ports are picked below the kernel's ephemeral range (`free_port`) and kept across
restarts, as a pod's are; the node writes the port it serves on to a file once serving,
which is how a start is known to be done. Its log goes to a file so a chatty node never
blocks on a full pipe, and the file is what a failing test shows.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

_PICKS = 64  # ports tried below the ephemeral range before leaving the pick to the kernel


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a process to listen on later (and again after a
    restart). Picked at random below the kernel's ephemeral range: the kernel hands
    ports from that range to every outgoing connection and every bind to port 0, and a
    test run on 2 workers makes thousands of them, so a port picked there was now and
    then taken before the process bound it (a node's restart failed "Address already in
    use" in CI). Below it only other picks compete."""
    low = _ephemeral_low()
    if low > 11024:
        rng = random.SystemRandom()
        for _ in range(_PICKS):
            port = rng.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _PortTaken(RuntimeError):
    """A port picked for a node was bound by someone else first."""


class LocalNode:
    def __init__(
        self,
        data_dir: str | Path,
        node_id: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.node_id = node_id
        self.host = host
        self.port = port
        # The internal listener's port, kept across restarts as the gRPC port is (callers
        # that hold a channel to it find the restarted node there), unless the caller's
        # --internal-listen says otherwise. Picked at the first start, which may run in
        # another network namespace (tests/nemesis), where `host` lives.
        self.internal_port = 0
        self._pick_internal = not any(a.startswith("--internal-listen") for a in extra_args)
        self.extra_args = extra_args
        self.env = env
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> LocalNode:
        """Spawn the node and return once it serves (its gRPC port is bound). The ports
        are picked here at the first start (`free_port`) and kept across restarts; one
        may be taken by another process before the node binds it (tests run side by
        side): then, at the first start only, others are picked (3 tries)."""
        tries = 3
        while True:
            first = not self.port
            if first:
                self.port = free_port(self.host)
            picked = self._pick_internal and not self.internal_port
            if picked:
                self.internal_port = free_port(self.host)
            try:
                return self._spawn(timeout)
            except _PortTaken:
                tries -= 1
                if not (first or picked) or not tries:
                    raise
                if first:
                    self.port = 0
                if picked:
                    self.internal_port = 0

    def _spawn(self, timeout: float) -> LocalNode:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        internal = [f"--internal-listen={self.host}:{self.internal_port}"] * bool(
            self.internal_port
        )
        argv = [
            sys.executable, "-m", "streamwal", "node",
            "--listen", f"{self.host}:{self.port}",
            "--data-dir", str(self.data_dir),
            "--node-id", str(self.node_id),
            "--port-file", str(self.port_file),
            *internal,
            *self.extra_args,
        ]  # fmt: skip
        self.port_file.unlink(missing_ok=True)
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self._serving_port()
            if port:
                self.port = port
                return self
            if self.proc.poll() is not None:
                said = self.log_path.read_bytes()[log_start:].decode(errors="replace")
                if "listen): Address already in use" in said:
                    raise _PortTaken(said)
                raise RuntimeError(f"node {self.node_id} exited at start:\n{self.log_tail()}")
            time.sleep(0.01)
        self.kill()
        raise TimeoutError(
            f"node {self.node_id} did not serve within {timeout}s:\n{self.log_tail()}"
        )

    def _serving_port(self) -> int | None:
        try:
            return int(self.port_file.read_text())
        except (OSError, ValueError):
            return None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the crash every durability promise is tested against."""
        self._signal(signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL after `timeout`)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def __enter__(self) -> LocalNode:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()
