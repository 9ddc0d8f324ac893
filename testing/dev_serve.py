"""`streamwal dev --serve`: an embedded coord and nodes kept up for a user to play with.

The nodes and the coord are local child processes (`LocalCluster`). A node that exits
-- `kill -9` it to see a failover -- is started again on the same data and port after a
second, as a StatefulSet would, so the coord can hand its channels back (or to another
node, which first copies their logs) and nothing acknowledged is lost. Ctrl-C or SIGTERM
stops every process (SIGTERM, then SIGKILL after a bound) and removes a temporary data
folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from streamwal.testing.local_cluster import LocalCluster

RESTART_AFTER_S = 1.0  # a killed node is back well within the coord's grace
WATCH_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 10.0


def banner(cluster: LocalCluster, root: Path, default_coord: bool) -> str:
    """What is up, and the commands to try (the README's getting-started uses them)."""
    lines = [
        f"streamwal dev: a coord and {len(cluster.nodes)} nodes are up "
        f"(data in {root}; Ctrl-C stops them)",
        f"  coord   {cluster.coord_address}",
    ]
    for node_id, node in sorted(cluster.nodes.items()):
        pid = node.proc.pid if node.proc else "-"
        lines.append(f"  node {node_id}  {node.address}  pid {pid}")
    lines.append("Try, in another shell:")
    if not default_coord:
        lines.append(f"  export STREAMWAL_COORD={cluster.coord_address}")
    lines += [
        "  streamwal channel create orders",
        "  printf 'k1:hello\\nk2:world\\n' | streamwal produce orders --key-separator :",
        "  streamwal consume orders --format json",
        "  streamwal channel describe orders     # NODE: the owner",
        "  kill -9 <pid of the owner>            # it restarts; clients follow the failover",
    ]
    return "\n".join(lines)


async def serve(
    root: Path,
    nodes: int,
    grace: float,
    listen: str,
    default_coord: bool,
    say: Callable[[str], None],
) -> None:
    """Start the cluster, print the banner, restart nodes that exit, until SIGINT or
    SIGTERM. The handlers stay until every process is stopped: a second Ctrl-C during
    the (bounded) stop does not abandon it."""
    cluster = LocalCluster(root, nodes=nodes, grace=grace, coord_address=listen)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await _start(cluster, stopping)
        if stopping.is_set():
            return
        say(banner(cluster, root, default_coord))
        while not stopping.is_set():
            coord = cluster.coord_proc
            if coord is not None and coord.poll() is not None:
                raise RuntimeError(
                    f"the coord exited ({coord.returncode}):\n{cluster.coord_log_tail()}"
                )
            for node_id, node in sorted(cluster.nodes.items()):
                if node.proc is not None and node.proc.poll() is not None:
                    await _restart(cluster, node_id, node.proc.returncode, say)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), WATCH_INTERVAL_S)
    finally:
        say("streamwal dev: stopping")
        await asyncio.to_thread(_stop, cluster)
        await cluster.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        say("streamwal dev: stopped")


async def _start(cluster: LocalCluster, stopping: asyncio.Event) -> None:
    """`cluster.start()`, given up when a stop is asked meanwhile."""
    starting = asyncio.ensure_future(cluster.start())
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    if starting.done() and not starting.cancelled():
        starting.result()


async def _restart(
    cluster: LocalCluster, node_id: int, code: int | None, say: Callable[[str], None]
) -> None:
    why = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    say(f"node {node_id} stopped ({why}); starting it again in {RESTART_AFTER_S:g}s")
    await asyncio.sleep(RESTART_AFTER_S)
    node = await cluster.start_node(node_id)
    pid = node.proc.pid if node.proc else "-"
    say(f"node {node_id} serving again at {node.address} (pid {pid})")


def _stop(cluster: LocalCluster) -> None:
    """SIGTERM the coord and the nodes (a clean stop), SIGKILL what outlives the bound."""
    if cluster.coord_proc is not None and cluster.coord_proc.poll() is None:
        cluster.coord_proc.terminate()
    for node in cluster.nodes.values():
        if node.proc is not None and node.proc.poll() is None:
            node.proc.terminate()
    for node in cluster.nodes.values():
        node.stop(STOP_TIMEOUT_S)
    if cluster.coord_proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):  # close() SIGKILLs it
            cluster.coord_proc.wait(STOP_TIMEOUT_S)
