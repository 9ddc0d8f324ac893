"""`streamwal coord` (run the coord) and `streamwal channel create|destroy|describe`."""

from __future__ import annotations

import asyncio
import json
import sys

import click
from google.protobuf.json_format import MessageToDict

from streamwal import logs
from streamwal.cli import (
    ACCESS_FILE,
    LOG_LEVEL,
    SECONDS,
    Address,
    check_address,
    server_transport,
)


class _Nodes(click.ParamType):
    """ID=HOST:PORT[,...]: ids 0 and up, each address HOST:PORT with a port 1..65535."""

    name = "id=host:port,..."

    def convert(self, value, param, ctx) -> str:
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        if not parts:
            self.fail("name at least one node as ID=HOST:PORT", param, ctx)
        for part in parts:
            node_id, sep, address = part.partition("=")
            if not sep or not (node_id.isascii() and node_id.isdigit()):
                self.fail(f"{part!r} is not ID=HOST:PORT with a numeric id", param, ctx)
            try:
                check_address(address)
            except ValueError as exc:
                self.fail(f"node {node_id}: {exc}", param, ctx)
        return str(value)


@click.command("coord")
@click.option(
    "--listen",
    default="127.0.0.1:19500",
    show_default=True,
    type=Address(listen=True),
    help="gRPC HOST:PORT.",
)
@click.option(
    "--meta-dir",
    required=True,
    type=click.Path(file_okay=False, writable=True),
    help="Meta store folder.",
)
@click.option("--nodes", required=True, type=_Nodes(), help="Streaming nodes: ID=HOST:PORT[,...].")
@click.option(
    "--metrics",
    default=None,
    type=Address(listen=True),
    help="Serve Prometheus metrics on HOST:PORT.",
)
@click.option(
    "--probe-interval",
    default=0.5,
    show_default=True,
    type=SECONDS,
    help="Seconds between probes of a node.",
)
@click.option(
    "--grace",
    default=1.5,
    show_default=True,
    type=SECONDS,
    help="Seconds without an answer before a node is lost.",
)
@click.option(
    "--max-moves",
    default=1,
    show_default=True,
    type=click.IntRange(0, 1_000_000),
    help="Rebalance: pchannels moved per round at most (0: no rebalancing).",
)
@click.option(
    "--tolerance",
    default=1,
    show_default=True,
    type=click.IntRange(0, 1_000_000),
    help="Rebalance only when loads differ by more than this.",
)
@click.option(
    "--rebalance-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.1, 86_400.0),
    help="Seconds between rebalance rounds.",
)
@click.option(
    "--max-clock-offset",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0.001, 3600.0),
    help="Seconds a node's wall clock may differ from the coord's; a node farther off "
    "leads nothing (its leaderships move, it is warned about and exported as a metric), "
    "so time ticks never run ahead of real time by more than this.",
)
@click.option(
    "--forget-missing-meta",
    is_flag=True,
    help="Start even though pchannel records the meta store once had are gone (deleted "
    "files): those pchannels are dropped for good. Without it the coord refuses to start.",
)
@ACCESS_FILE
@LOG_LEVEL
def coord(
    listen: str,
    meta_dir: str,
    nodes: str,
    metrics: str | None,
    probe_interval: float,
    grace: float,
    max_moves: int,
    tolerance: int,
    rebalance_interval: float,
    max_clock_offset: float,
    forget_missing_meta: bool,
    access_file: str | None,
    log_level: str,
) -> None:
    """Run the coord: assigns pchannels to nodes, fails them over, tells clients."""
    security = server_transport(access_file)
    from streamwal.coord.coordinator import CoordConfig
    from streamwal.coord.server import parse_nodes, serve
    from streamwal.errors import StreamingError

    logs.configure(log_level)
    try:
        config = CoordConfig(
            nodes=parse_nodes(nodes),
            probe_interval=probe_interval,
            grace=grace,
            max_moves_per_round=max_moves,
            tolerance=tolerance,
            rebalance_interval=rebalance_interval,
            max_clock_offset=max_clock_offset,
        )
        asyncio.run(serve(listen, meta_dir, config, metrics, forget_missing_meta, security))
    except StreamingError as err:
        raise click.ClickException(str(err)) from None


@click.group("channel")
def channel() -> None:
    """Manage pchannels through the coord."""


_COORD = click.option(
    "--coord",
    "address",
    default="127.0.0.1:19500",
    show_default=True,
    type=Address(),
    help="Coord gRPC HOST:PORT.",
)


def _odd_replicas(_ctx, _param, value: int) -> int:
    if value % 2 == 0:
        raise click.BadParameter(f"{value} is even: a replica set has an odd size (1, 3, 5, 7, 9)")
    return value


def _call(address: str, method: str, request):
    from grpc import aio

    from streamwal import transport
    from streamwal.grpc_errors import from_trailing
    from streamwal.proto import coord_pb2_grpc as cpbg

    async def go():
        async with transport.make_channel(address) as ch:
            stub = cpbg.StreamingCoordChannelServiceStub(ch)
            try:
                return await getattr(stub, method)(request, timeout=30)
            except aio.AioRpcError as err:
                typed = from_trailing(err.trailing_metadata())
                raise click.ClickException(str(typed) if typed else err.details()) from None

    return asyncio.run(go())


@channel.command("create")
@_COORD
@click.option(
    "--count",
    default=1,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="How many pchannels.",
)
@click.option("--prefix", default="", help="Names are PREFIX_N (default pchannel_N).")
@click.option("--role", default="cli", show_default=True, help="Owner role.")
@click.option("--description", default="", help="Owner description text.")
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(1, 9),
    callback=_odd_replicas,
    help="Copies of each log on distinct nodes (odd: 1, 3, 5, 7, 9); producers are "
    "acknowledged once a majority stored a message.",
)
def create(
    address: str, count: int, prefix: str, role: str, description: str, replicas: int
) -> None:
    """Create pchannels; prints their names, one per line."""
    from streamwal.proto import coord_pb2 as cpb

    owner = cpb.OwnerDescription(role=role, description_text=description)
    request = cpb.CreateChannelsRequest(
        owner=owner, num_channels=count, prefix=prefix, replicas=replicas
    )
    for name in _call(address, "CreateChannels", request).channel_names:
        click.echo(name)


@channel.command("destroy")
@_COORD
@click.argument("names", nargs=-1, required=True)
def destroy(address: str, names: tuple[str, ...]) -> None:
    """Destroy pchannels (their names are never reused)."""
    from streamwal.proto import coord_pb2 as cpb

    _call(address, "DestroyChannels", cpb.DestroyChannelsRequest(channel_names=list(names)))


def replicas_column(d) -> str:
    """`1`, or `3: 1*@120 2@120(lag 0) 3@97(lag 23)`: members, leader starred, acked offsets."""
    if not d.members:
        return str(d.replicas or 1)
    progress = {p.node_id: p for p in d.progress}
    leader = d.meta.node.server_id
    parts = []
    for m in d.members:
        if m.server_id == leader:
            end = f"@{d.next_offset}" if d.next_offset or d.progress else ""
            parts.append(f"{m.server_id}*{end}")
        elif m.server_id in progress:
            p = progress[m.server_id]
            parts.append(f"{m.server_id}@{p.acked_offset}(lag {p.lag})")
        else:
            parts.append(str(m.server_id))
    return f"{d.replicas}: " + " ".join(parts)


@channel.command("describe")
@_COORD
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per channel.")
def describe(address: str, names: tuple[str, ...], as_json: bool) -> None:
    """Show pchannels (all when no name is given): state, term, node, owner, replicas.

    For a replicated pchannel REPLICAS lists its members, the leader starred with its log
    end, each follower with the offset it acknowledged and its lag behind the leader."""
    from streamwal.proto import coord_pb2 as cpb
    from streamwal.proto import streaming_pb2 as pb

    response = _call(
        address, "DescribeChannels", cpb.DescribeChannelsRequest(channel_names=list(names))
    )
    if as_json:
        for d in response.descriptions:
            click.echo(json.dumps(MessageToDict(d, preserving_proto_field_name=True)))
        return
    rows = [("PCHANNEL", "STATE", "TERM", "NODE", "ADDRESS", "OWNER", "REPLICAS")]
    for d in response.descriptions:
        state = pb.PChannelMetaState.Name(d.meta.state).removeprefix("PCHANNEL_META_STATE_")
        if d.data_loss:
            state = "DATA_LOSS"
        rows.append(
            (
                d.channel_name,
                state,
                str(d.meta.channel.term),
                str(d.meta.node.server_id) if d.meta.HasField("node") else "-",
                d.meta.node.address or "-",
                d.owner.role or "-",
                replicas_column(d),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for d in response.descriptions:
        if d.data_loss:
            click.echo(f"{d.channel_name}: {d.data_loss}", err=True)
    sys.stdout.flush()


@channel.command("accept-loss")
@_COORD
@click.argument("name")
def accept_loss(address: str, name: str) -> None:
    """Serve again a single-replica pchannel whose only copy lost acknowledged records
    (state DATA_LOSS in `describe`). The lost messages are gone for good; the pchannel
    continues under a new term above every offset it ever acknowledged, so no offset is
    acknowledged twice. Replicated pchannels need no such step: a damaged replica is
    rebuilt from a healthy one."""
    from streamwal.proto import coord_pb2 as cpb

    _call(address, "AcceptDataLoss", cpb.AcceptDataLossRequest(channel_name=name))
    click.echo(f"{name}: loss accepted, serving again")
