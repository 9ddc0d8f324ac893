"""The `streamwal` command: one entry point whose subcommands live with their parts.

Subcommands are imported only when invoked, so `streamwal node` does not pay for the
benchmark peers, Kopf or Spark at every start (the node's restart time includes it).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

import click

from streamwal import __version__
from streamwal.units import parse_duration_ms, parse_size

if TYPE_CHECKING:  # the transport imports gRPC: only the commands that serve load it
    from streamwal.transport import TransportConfig

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "text")
MAX_PORT = 65535


def check_address(value: str, listen: bool = False) -> str:
    """`value` if it is HOST:PORT with a port 1..65535 (0 too when `listen`: any free
    port); ValueError otherwise. gRPC would bind port 99999 as 34463, silently."""
    host, sep, port = value.rpartition(":")
    low = 0 if listen else 1
    bracketed = host.startswith("[") and host.endswith("]")
    if (
        not sep
        or not host
        or not host.isprintable()
        or " " in host
        or (":" in host and not bracketed)
        or not (port.isascii() and port.isdigit() and low <= int(port) <= MAX_PORT)
    ):
        hint = " (0: any free port)" if listen else ""
        raise ValueError(
            f"{value!r} is not HOST:PORT with a host (0.0.0.0 for every interface, "
            f"[::1] for IPv6) and a port {low}..{MAX_PORT}{hint}"
        )
    return value


def size_text(n: float) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n} bytes"


ACCESS_FILE = click.option(
    "--access-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Who may call what (YAML or JSON, docs/security.md): identities from client "
    "certificates, roles, pchannels. Required with mutual TLS (STREAMWAL_TLS_CA), refused "
    "without it.",
)


def server_transport(access_file: str | None) -> TransportConfig:
    """A server's transport (STREAMWAL_TLS_*) with the rules of --access-file; a click
    error (one line, exit status 2) when the file is wrong or security is half on."""
    from streamwal.access import AccessError
    from streamwal.transport import TransportConfig

    try:
        return TransportConfig.from_env().for_server(access_file)
    except AccessError as exc:
        raise click.BadParameter(str(exc), param_hint="--access-file") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


class Address(click.ParamType):
    """HOST:PORT (see `check_address`)."""

    name = "host:port"

    def __init__(self, listen: bool = False) -> None:
        self.listen = listen

    def convert(self, value, param, ctx) -> str:
        try:
            return check_address(str(value), self.listen)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Quantity(click.ParamType):
    """A value in human units (`parse`), within [low, high] (`show` writes a bound)."""

    def __init__(self, low: float = 0, high: float | None = None) -> None:
        self.low = low
        self.high = high

    def parse(self, text: str) -> float:
        raise NotImplementedError

    def show(self, bound: float) -> str:
        raise NotImplementedError

    def convert(self, value, param, ctx):
        try:
            n = value if isinstance(value, int | float) else self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if n < self.low or (self.high is not None and n > self.high):
            top = f" and at most {self.show(self.high)}" if self.high is not None else ""
            self.fail(f"{value!r} must be at least {self.show(self.low)}{top}", param, ctx)
        return n


class Size(_Quantity):
    """A size in bytes (4096, 4MiB, 10GB), within [low, high]."""

    name = "size"

    def parse(self, text: str) -> int:
        return parse_size(text)

    def show(self, bound: float) -> str:
        return size_text(int(bound))


class Duration(_Quantity):
    """A duration (200ms, 30s, 10m, 7d) in seconds, within [low, high] seconds."""

    name = "duration"

    def parse(self, text: str) -> float:
        return parse_duration_ms(text) / 1000

    def show(self, bound: float) -> str:
        return f"{bound:g}s"


# Seconds for intervals and grace periods given as plain numbers (coord, operator).
SECONDS = click.FloatRange(0.01, 86_400.0)

LOG_LEVEL = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
)


GLOBAL_COORD_ENV = "STREAMWAL_COORD"


class CoordOption(click.Option):
    """`--coord`: from the flag, STREAMWAL_<COMMAND>_COORD, or the global STREAMWAL_COORD
    (as NATS_URL is for every `nats` command), in that order."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        return super().resolve_envvar_value(ctx) or os.environ.get(GLOBAL_COORD_ENV) or None


def coord_option(required: bool = False, **kwargs):
    """The `--coord HOST:PORT` option of every command that talks to a coord."""
    return click.option(
        "--coord",
        cls=CoordOption,
        type=Address(),
        default=None if required else "127.0.0.1:19500",
        show_default=not required,
        help=f"Coord gRPC HOST:PORT (also from {GLOBAL_COORD_ENV}).",
        **kwargs,
    )


def _show_envvars(command: click.Command) -> click.Command:
    """Every option's variable in `--help` (STREAMWAL_<COMMAND>_<OPTION>)."""
    for param in command.params:
        if isinstance(param, click.Option):
            param.show_envvar = True
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _show_envvars(sub)
    return command


class LazyGroup(click.Group):
    """A click group whose commands are "module:attribute" paths, imported on use.

    `admin` names commands that also have subcommands served elsewhere: `streamwal node`
    runs a node, `streamwal node list|drain|undrain` asks the coord about nodes."""

    def __init__(
        self,
        *args,
        lazy: dict[str, str],
        admin: dict[str, tuple[str, frozenset[str]]] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy
        self._admin = admin or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self._lazy:
            return _show_envvars(_load(self._lazy[name]))
        return super().get_command(ctx, name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name in self._admin and len(args) > 1 and args[1] in self._admin[name][1]:
            return name, _show_envvars(_load(self._admin[name][0])), args[1:]
        return super().resolve_command(ctx, args)


def _load(path: str) -> click.Command:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@click.group(
    cls=LazyGroup,
    lazy={
        "dev": "streamwal.testing.dev:dev",
        "node": "streamwal.node.cli:node",
        "wait-drained": "streamwal.node.cli:wait_drained",
        "produce": "streamwal.client.cli:produce",
        "consume": "streamwal.client.cli:consume",
        "bench": "streamwal.bench.cli:bench",
        "coord": "streamwal.coord.cli:coord",
        "channel": "streamwal.coord.cli:channel",
        "operator": "streamwal.operator.cli:operator",
        "group": "streamwal.client.group_cli:group",
        "broadcast": "streamwal.client.broadcast_cli:broadcast",
    },
    admin={"node": ("streamwal.coord.cli:nodes", frozenset({"list", "drain", "undrain"}))},
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "STREAMWAL"},
)
@click.version_option(__version__, prog_name="streamwal")
def main() -> None:
    """streamwal: a write-ahead log of physical channels for streaming systems.

    Every option can also be set from the environment as STREAMWAL_<COMMAND>_<OPTION>,
    for example STREAMWAL_NODE_DATA_DIR (each command's --help names them);
    STREAMWAL_COORD is the coord address of every command that talks to one.
    STREAMWAL_LOG_FORMAT is json (the default) or
    text; STREAMWAL_LOG_LEVEL is the level where a command has no --log-level.
    """
    for name, allowed, value in (
        ("STREAMWAL_LOG_FORMAT", LOG_FORMATS, os.environ.get("STREAMWAL_LOG_FORMAT")),
        ("STREAMWAL_LOG_LEVEL", LOG_LEVELS, os.environ.get("STREAMWAL_LOG_LEVEL", "").lower()),
    ):
        if value and value not in allowed:
            raise click.UsageError(f"{name}={value!r}: use one of {', '.join(allowed)}")
