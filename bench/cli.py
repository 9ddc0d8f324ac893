"""`streamwal bench`: benchmarks that print JSON (never timed tests)."""

import signal
import sys

import click

from streamwal.cli import LazyGroup


@click.group(
    "bench",
    cls=LazyGroup,
    lazy={
        "node": "streamwal.bench.node:node",
        "compare": "streamwal.bench.compare:compare",
        "spark": "streamwal.bench.spark:spark",
        "trace": "streamwal.bench.sched_trace:trace",
        "after-burst": "streamwal.bench.after_burst:after_burst",
        "scale": "streamwal.bench.scale:scale",
    },
)
def bench() -> None:
    """Benchmarks; each prints progress on stderr and one JSON object last on stdout."""
    # SIGTERM (a CI timeout, `timeout`, `kill`) unwinds like Ctrl-C, so every process a
    # benchmark started is stopped by its `finally` (bench scale left its nodes running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
