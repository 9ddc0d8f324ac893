"""`streamwal bench`: benchmarks that print JSON (never timed tests)."""

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
        "scale": "streamwal.bench.scale:scale",
    },
)
def bench() -> None:
    """Benchmarks; each prints progress on stderr and one JSON object last on stdout."""
