"""`streamwal coord` (run the coord), `streamwal channel create|list|describe|destroy` and
`streamwal node list|drain|undrain` (ask it)."""

from __future__ import annotations

import asyncio
import json
import sys

import click
import grpc
from google.protobuf.json_format import MessageToDict

from streamwal import logs
from streamwal.cli import (
    ACCESS_FILE,
    LOG_LEVEL,
    SECONDS,
    Address,
    Duration,
    Size,
    check_address,
    coord_option,
    server_transport,
)
from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL


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
    default=DEFAULT_PROBE_INTERVAL,
    show_default=True,
    type=SECONDS,
    help="Seconds between probes of a node.",
)
@click.option(
    "--grace",
    default=DEFAULT_GRACE,
    show_default=True,
    type=SECONDS,
    help="Seconds without an answer before a node is lost; also how long a pchannel that "
    "allows data loss waits for its only copy's node before moving without it.",
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
    help="Start even though pchannel records the meta store once had are gone (its live "
    "journal deleted, or record files of the earlier format): those pchannels are dropped "
    "for good. Without it the coord refuses to start.",
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
    from streamwal.transport import StartupError

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
    except (StreamingError, StartupError) as err:
        raise click.ClickException(str(err)) from None


@click.group("channel")
def channel() -> None:
    """Create, list, describe and destroy channels (pchannels) through the coord."""


def _odd_replicas(_ctx, _param, value: int) -> int:
    if value % 2 == 0:
        raise click.BadParameter(f"{value} is even: a replica set has an odd size (1, 3, 5, 7, 9)")
    return value


def call(address: str, method: str, request):
    """One unary call of the coord's channel service; its error as one line (exit 1)."""
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
                if typed is None and err.code() == grpc.StatusCode.UNAVAILABLE:
                    raise click.ClickException(f"no coord answers at {address}") from None
                raise click.ClickException(str(typed) if typed else err.details()) from None

    return asyncio.run(go())


@channel.command("create")
@coord_option()
@click.argument("names", nargs=-1)
@click.option(
    "--count",
    default=None,
    type=click.IntRange(1, 10_000),
    help="Without NAMES: how many pchannels, named PREFIX_N (default 1).",
)
@click.option(
    "--prefix", default="", help="Without NAMES: names are PREFIX_N (default pchannel_N)."
)
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
@click.option(
    "--allow-data-loss",
    is_flag=True,
    help="A single-replica pchannel whose node is gone for the coord's grace period moves "
    "without its records (unclean failover). Default: it waits for that node.",
)
@click.option(
    "--retention",
    default=None,
    type=Duration(low=0.001, high=100 * 365 * 86_400),
    help="Drop messages older than this (7d, 12h); default: the nodes' --retention-age.",
)
@click.option(
    "--retention-size",
    default=None,
    type=Size(low=1),
    help="Keep at most about this much of the log (10GiB); default: the nodes' --retention-size.",
)
def create(
    coord: str,
    names: tuple[str, ...],
    count: int | None,
    prefix: str,
    role: str,
    description: str,
    replicas: int,
    allow_data_loss: bool,
    retention: float | None,
    retention_size: int | None,
) -> None:
    """Create channels: NAMES (letters, digits, '_', '.', '-'), or --count of them named
    PREFIX_N. Prints their names, one per line."""
    from streamwal.proto import coord_pb2 as cpb
    from streamwal.proto import streaming_pb2 as pb

    if names and (count is not None or prefix):
        raise click.UsageError("give channel NAMES or --count/--prefix, not both")
    owner = cpb.OwnerDescription(role=role, description_text=description)
    request = cpb.CreateChannelsRequest(
        owner=owner, replicas=replicas, names=list(names), allow_data_loss=allow_data_loss
    )
    if not names:
        request.num_channels = count or 1
        request.prefix = prefix
    if retention is not None or retention_size is not None:
        request.retention.CopyFrom(
            pb.RetentionPolicy(
                max_age_ms=round((retention or 0) * 1000), max_bytes=retention_size or 0
            )
        )
    for name in call(coord, "CreateChannels", request).channel_names:
        click.echo(name)


@channel.command("destroy")
@coord_option()
@click.argument("names", nargs=-1, required=True)
def destroy(coord: str, names: tuple[str, ...]) -> None:
    """Destroy pchannels (their names are never reused)."""
    from streamwal.proto import coord_pb2 as cpb

    call(coord, "DestroyChannels", cpb.DestroyChannelsRequest(channel_names=list(names)))


def replicas_column(d) -> str:
    """`1: 2*@120` or `3: 1*@120 2@120(lag 0) 3@97(lag 23)`: members, leader starred with
    its log end, followers with the offsets they acknowledged."""
    progress = {p.node_id: p for p in d.progress}
    leader = d.meta.node.server_id if d.meta.HasField("node") else None
    reported = bool(d.next_offset or d.progress)
    members = [m.server_id for m in d.members] or ([leader] if leader is not None else [])
    if not members:
        return str(d.replicas or 1)
    parts = []
    for m in members:
        if m == leader:
            parts.append(f"{m}*@{d.next_offset}" if reported else f"{m}*")
        elif m in progress:
            p = progress[m]
            parts.append(f"{m}@{p.acked_offset}(lag {p.lag})")
        else:
            parts.append(str(m))
    return f"{d.replicas or 1}: " + " ".join(parts)


def _reported(d) -> bool:
    """Whether the leader has reported the pchannel (offsets known)."""
    return bool(d.next_offset or d.progress or d.size_bytes)


def _human_ms(ms: int) -> str:
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= factor and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def _bytes(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.1f}{unit}"
    return f"{n}B"


def _cells(d) -> dict[str, str]:
    """One channel's columns, shared by `channel list` and `channel describe`."""
    from streamwal.cli import size_text
    from streamwal.proto import streaming_pb2 as pb

    state = pb.PChannelMetaState.Name(d.meta.state).removeprefix("PCHANNEL_META_STATE_")
    if d.data_loss:
        state = "DATA_LOSS"
    known = _reported(d)
    empty = known and d.next_offset <= d.first_offset
    bounds = []
    if d.retention.max_age_ms:
        bounds.append(_human_ms(d.retention.max_age_ms))
    if d.retention.max_bytes:
        bounds.append(size_text(d.retention.max_bytes))
    return {
        "NAME": d.channel_name,
        "STATE": state,
        "TERM": str(d.meta.channel.term),
        "NODE": str(d.meta.node.server_id) if d.meta.HasField("node") else "-",
        "ADDRESS": d.meta.node.address or "-",
        "OWNER": d.owner.role or "-",
        "REPLICAS": replicas_column(d),
        "FIRST": str(d.first_offset) if known and not empty else "-",
        "LAST": str(d.next_offset - 1) if known and not empty else "-",
        "SIZE": _bytes(d.size_bytes) if known else "-",
        "RETENTION": ",".join(bounds) or "default",
    }


def _table(descriptions, columns: tuple[str, ...]) -> None:
    rows = [columns] + [tuple(_cells(d)[c] for c in columns) for d in descriptions]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for d in descriptions:
        if d.data_loss:
            click.echo(f"{d.channel_name}: {d.data_loss}", err=True)
        elif d.waiting:
            click.echo(f"{d.channel_name}: no leader: {d.waiting}", err=True)
    sys.stdout.flush()


def _describe(coord: str, names: tuple[str, ...]):
    from streamwal.proto import coord_pb2 as cpb

    request = cpb.DescribeChannelsRequest(channel_names=list(names))
    return call(coord, "DescribeChannels", request).descriptions


def _json_lines(descriptions) -> None:
    for d in descriptions:
        click.echo(json.dumps(MessageToDict(d, preserving_proto_field_name=True)))


@channel.command("list")
@coord_option()
@click.option("--json", is_flag=True, help="One JSON object per channel.")
def list_(coord: str, json: bool) -> None:
    """List every channel: name, owner, term, state, replicas, first/last offset, size.

    Offsets and size are what the leader last reported ("-" until it has, or while the
    channel is empty); LAST is the offset of the newest message."""
    descriptions = _describe(coord, ())
    if json:
        _json_lines(descriptions)
        return
    _table(
        descriptions,
        ("NAME", "OWNER", "TERM", "STATE", "REPLICAS", "FIRST", "LAST", "SIZE"),
    )


@channel.command("describe")
@coord_option()
@click.argument("names", nargs=-1)
@click.option("--json", is_flag=True, help="One JSON object per channel.")
def describe(coord: str, names: tuple[str, ...], json: bool) -> None:
    """Show channels (all when no name is given): state, term, node, owner, replicas,
    offsets, size and retention.

    REPLICAS lists the members (one for a single-replica channel), the leader starred
    with its log end, each follower with the offset it acknowledged and its lag behind
    the leader. FIRST/LAST: the oldest retained and the newest offset."""
    descriptions = _describe(coord, names)
    if json:
        _json_lines(descriptions)
        return
    _table(
        descriptions,
        (
            "NAME",
            "STATE",
            "TERM",
            "NODE",
            "ADDRESS",
            "OWNER",
            "REPLICAS",
            "FIRST",
            "LAST",
            "SIZE",
            "RETENTION",
        ),
    )


@click.group("node")
def nodes() -> None:
    """Ask the coord about streaming nodes (`streamwal node --data-dir ...` runs one)."""


@nodes.command("list")
@coord_option()
@click.option("--json", is_flag=True, help="One JSON object per node.")
def node_list(coord: str, json: bool) -> None:
    """List the nodes the coord manages: id, address, liveness, drained, channels led."""
    from streamwal.proto import coord_pb2 as cpb

    described = call(coord, "ListNodes", cpb.ListNodesRequest()).nodes
    if json:
        _json_lines(described)
        return
    rows = [("ID", "ADDRESS", "LIVENESS", "DRAINED", "CHANNELS")]
    for n in described:
        rows.append(
            (
                str(n.node.server_id),
                n.node.address,
                n.liveness,
                "yes" if n.drained else "no",
                str(n.channels),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@nodes.command("drain")
@coord_option()
@click.argument("node_id", type=click.IntRange(0, 2**63 - 1))
def node_drain(coord: str, node_id: int) -> None:
    """Move every channel NODE_ID leads to other nodes and give it no new ones (before
    maintenance); `node undrain` takes it back."""
    from streamwal.proto import coord_pb2 as cpb

    call(coord, "DrainNode", cpb.DrainNodeRequest(server_id=node_id))
    click.echo(f"node {node_id}: drained (its channels move away)")


@nodes.command("undrain")
@coord_option()
@click.argument("node_id", type=click.IntRange(0, 2**63 - 1))
def node_undrain(coord: str, node_id: int) -> None:
    """Let NODE_ID take channels again (the rebalancer moves some back)."""
    from streamwal.proto import coord_pb2 as cpb

    call(coord, "DrainNode", cpb.DrainNodeRequest(server_id=node_id, undrain=True))
    click.echo(f"node {node_id}: takes channels again")


@channel.command("accept-loss")
@coord_option()
@click.argument("name")
def accept_loss(coord: str, name: str) -> None:
    """Serve again a single-replica pchannel whose only copy lost acknowledged records
    (state DATA_LOSS in `describe`). The lost messages are gone for good; the pchannel
    continues under a new term above every offset it ever acknowledged, so no offset is
    acknowledged twice. Replicated pchannels need no such step: a damaged replica is
    rebuilt from a healthy one."""
    from streamwal.proto import coord_pb2 as cpb

    call(coord, "AcceptDataLoss", cpb.AcceptDataLossRequest(channel_name=name))
    click.echo(f"{name}: loss accepted, serving again")
