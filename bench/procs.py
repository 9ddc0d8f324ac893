"""Servers the benchmark starts itself: free loopback ports, readiness, sure clean-up."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

HOST = "127.0.0.1"
EXIT_S = 5.0  # bound on a killed process's exit
_LIVE: set[Server] = set()


@atexit.register
def _stop_all() -> None:
    """A benchmark cut short (Ctrl-C, SIGTERM, a crash) still leaves no server behind."""
    for server in list(_LIVE):
        server.stop(grace=2.0)


class Server:
    """One child process, its output in a log file, always killed on `stop`."""

    def __init__(
        self, name: str, argv: Sequence[str], workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = workdir / f"{name}.log"
        self._env = {**os.environ, **(env or {})}
        self._workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._workdir,
                env=self._env,
                start_new_session=True,
            )
        finally:
            log.close()
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def wait_ready(self, probe: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
        """Polls `probe` until it answers True; a process that exits early fails fast."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            with contextlib.suppress(OSError, asyncio.TimeoutError, ConnectionError):
                if await probe():
                    return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self, grace: float = 0.0) -> None:
        """Stops the process (`stop_all`); safe to call twice."""
        stop_all([self], grace)


def stop_all(servers: Iterable[Server], grace: float = 0.0) -> None:
    """Stops every server at once and waits (bounded) for each to exit; safe to call twice.

    SIGKILL unless `grace` is given: a benchmarked server holds nothing worth a clean
    stop (its temp dir is removed next), and the graceful stops were a wait of their own
    (three streaming nodes flushing: 0.4 s at load 5, 0.9 s at load 7). With `grace`,
    SIGTERM first and SIGKILL to any still running `grace` seconds later."""
    procs = []
    for server in servers:
        proc, server.proc = server.proc, None
        _LIVE.discard(server)
        if proc is not None and proc.poll() is None:
            if grace > 0:
                proc.terminate()
            else:
                proc.kill()
            procs.append(proc)
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        if proc.returncode is None:  # still running after its grace
            proc.kill()
        proc.wait(EXIT_S)


async def port_open(port: int) -> bool:
    """True once something accepts TCP connections on the loopback port."""
    _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 1.0)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


class OneServer:
    """A benchmarked system served by one `Server` of its own (`_server`, once started)."""

    _server: Server | None

    @property
    def server_pid(self) -> int:
        """The process that answers producers (`bench trace` follows it)."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._server.pid
