"""The `streamwal` command: one entry point whose subcommands live with their parts.

Subcommands are imported only when invoked, so `streamwal node` does not pay for the
benchmark peers, Kopf or Spark at every start (the node's restart time includes it).
"""

from __future__ import annotations

import importlib

import click

from streamwal import __version__


class LazyGroup(click.Group):
    """A click group whose commands are "module:attribute" paths, imported on use."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(
    cls=LazyGroup,
    lazy={
        "dev": "streamwal.testing.dev:dev",
        "node": "streamwal.node.cli:node",
        "produce": "streamwal.client.cli:produce",
        "consume": "streamwal.client.cli:consume",
        "bench": "streamwal.bench.cli:bench",
        "coord": "streamwal.coord.cli:coord",
        "channel": "streamwal.coord.cli:channel",
        "operator": "streamwal.operator.cli:operator",
    },
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "STREAMWAL"},
)
@click.version_option(__version__, prog_name="streamwal")
def main() -> None:
    """streamwal: a write-ahead log of physical channels for streaming systems.

    Every option can also be set from the environment as STREAMWAL_<COMMAND>_<OPTION>,
    for example STREAMWAL_NODE_DATA_DIR.
    """
