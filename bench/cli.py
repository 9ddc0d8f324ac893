"""`streamwal bench`: benchmarks that print JSON (never timed tests)."""

import click

from streamwal.bench.compare import compare
from streamwal.bench.node import node
from streamwal.bench.spark_read import spark


@click.group("bench")
def bench() -> None:
    """Benchmarks; each prints progress on stderr and one JSON object last on stdout."""


bench.add_command(node)
bench.add_command(compare)
bench.add_command(spark)
