"""The `streamwal` command: one entry point whose subcommands live with their parts."""

from __future__ import annotations

import click

from streamwal import __version__


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "STREAMWAL"}
)
@click.version_option(__version__, prog_name="streamwal")
def main() -> None:
    """streamwal: a write-ahead log of physical channels for streaming systems.

    Every option can also be set from the environment as STREAMWAL_<COMMAND>_<OPTION>,
    for example STREAMWAL_NODE_DATA_DIR.
    """


def _register() -> None:
    from streamwal.bench.cli import bench
    from streamwal.client.cli import consume, produce
    from streamwal.coord.cli import channel, coord
    from streamwal.coord.dev import dev
    from streamwal.node.cli import node
    from streamwal.operator.cli import operator

    for command in (dev, node, produce, consume, bench, coord, channel, operator):
        main.add_command(command)


_register()
