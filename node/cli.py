"""`streamwal node`: run a streaming node.

Every flag (and its STREAMWAL_NODE_* variable) is checked by its click type before the
node starts: a bad value is one line and exit status 2, never a traceback or a silent
surprise (a port over 65535, a zero interval that spins a core). docs/limits.md lists
the limits.
"""

from __future__ import annotations

import asyncio
import os

import click

from streamwal import logs
from streamwal.cli import (
    ACCESS_FILE,
    LOG_LEVEL,
    Address,
    Duration,
    Size,
    server_transport,
)
from streamwal.node.config import NodeConfig

KIB, MIB, GIB = 1024, 1024**2, 1024**3
DAY = 86_400.0
# gRPC takes its limits as 32-bit ints (bytes, milliseconds)
MAX_GRPC_INT = 2**31 - 1
COUNT = click.IntRange(1, 10_000_000)


class _ListenOr(Address):
    """HOST:PORT, or one of `words`."""

    def __init__(self, *words: str) -> None:
        super().__init__(listen=True)
        self.words = words
        self.name = "|".join((*words, "host:port"))

    def convert(self, value, param, ctx) -> str:
        return value if value in self.words else super().convert(value, param, ctx)


@click.command("node")
@click.option(
    "--listen",
    default="127.0.0.1:19530",
    show_default=True,
    type=Address(listen=True),
    help="gRPC HOST:PORT (port 0: any free port, see --port-file).",
)
@click.option(
    "--internal-listen",
    default="auto",
    show_default=True,
    type=_ListenOr("auto", "shared"),
    help="The internal listener: the manager, replication and batch services (Assign, "
    "Remove, Fence, Fetch, Replicate, and Assign/Remove/Fence of many pchannels per call; "
    "read-only CollectStatus is on --listen too), called only by "
    "the coord, the operator and peer nodes. HOST:PORT, 'auto' (the --listen host, any "
    "free port; peers learn it from the node's Describe) or 'shared' (on --listen, as the "
    "seed's single port).",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, writable=True),
    help="RocksDB folder.",
)
@click.option(
    "--node-id",
    default=1,
    show_default=True,
    type=click.IntRange(0, 2**63 - 1),
    help="Server id reported to coord.",
)
@click.option(
    "--metrics",
    default=None,
    type=Address(listen=True),
    help="Serve Prometheus metrics on HOST:PORT.",
)
@click.option(
    "--durability",
    type=click.Choice(["sync", "async"]),
    default="sync",
    show_default=True,
    help="sync: fsync every group commit before acknowledging; async: acknowledge once "
    "the OS has the write (survives kill -9, not power loss).",
)
@click.option(
    "--wal-prewarm",
    default="64MiB",
    show_default=True,
    type=Size(0, 16 * GIB),
    help="On a new data dir with sync durability, write and drop this much filler once "
    "(~0.3 s) so the first appends overwrite a recycled WAL file: lower fsync latency "
    "from the first message (0: off).",
)
@click.option(
    "--compaction-priority",
    type=click.Choice(["low", "normal"]),
    default="low",
    show_default=True,
    help="CPU priority of RocksDB's compaction threads. low: nice 19, so on a busy small "
    "node compactions yield to the loop answering producers (lower tail latency after "
    "bursts); normal: the node's own priority (compactions keep pace on a saturated node).",
)
@click.option(
    "--max-message-size",
    default="4MiB",
    show_default=True,
    type=Size(1, GIB),
    help="Largest message (below --max-frame-size).",
)
@click.option(
    "--time-tick-interval",
    default="200ms",
    show_default=True,
    type=Duration(0.01, 3600),
    help="Idle time-tick period: a pchannel with a consumer that takes time ticks gets "
    "one per period while nothing else is appended (none without such a consumer).",
)
@click.option(
    "--retention-age",
    default="0",
    show_default=True,
    type=Duration(0, 36_500 * DAY),
    help="Default max age, e.g. 7d (0: forever).",
)
@click.option(
    "--retention-size",
    default="0",
    show_default=True,
    type=Size(0, 2**62),
    help="Default max bytes per pchannel, e.g. 10GiB (0: unlimited).",
)
@click.option(
    "--retention-check-interval",
    default="5s",
    show_default=True,
    type=Duration(0.1, DAY),
    help="How often retention bounds are applied.",
)
@click.option(
    "--producer-idle",
    default="10m",
    show_default=True,
    type=Duration(0.01, 365 * DAY),
    help="An idempotent producer's state leaves memory after this long unused (checked "
    "with retention); its window stays on disk and is read again if it returns.",
)
@click.option(
    "--producer-window",
    default="64MiB",
    show_default=True,
    type=Size(64 * KIB, 16 * GIB),
    help="Bytes one producer may have awaiting their acknowledgement; beyond it the node "
    "stops reading that producer's stream until acks free room (TCP slows the producer).",
)
@click.option(
    "--max-pending-answers",
    default=4096,
    show_default=True,
    type=COUNT,
    help="Answers one producer may have waiting to be written (a producer that does not "
    "read them); beyond it the node stops reading that producer's stream.",
)
@click.option(
    "--txn-keepalive",
    default="10s",
    show_default=True,
    type=Duration(0.001, 7 * DAY),
    help="A txn without an append for this long expires (rolled back); clients may set "
    "their own per txn, up to --txn-max-keepalive.",
)
@click.option(
    "--txn-max-keepalive",
    default="10m",
    show_default=True,
    type=Duration(0.001, 7 * DAY),
    help="The longest keepalive a client may ask for a txn.",
)
@click.option(
    "--txn-max-bytes",
    default="16MiB",
    show_default=True,
    type=Size(KIB, 16 * GIB),
    help="Buffered bytes per txn.",
)
@click.option(
    "--txn-max-open", default=1024, show_default=True, type=COUNT, help="Open txns per node."
)
@click.option(
    "--txn-max-open-per-stream",
    default=64,
    show_default=True,
    type=COUNT,
    help="Open txns per producer stream (one stream cannot take the node's all).",
)
@click.option(
    "--max-connections",
    default=4096,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Connections per listener (gRPC, internal, produce and replication ports); the node "
    "raises its open-file limit to hold them all.",
)
@click.option(
    "--max-connections-per-peer",
    default=1024,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Connections from one peer address per listener (gRPC: connections with calls).",
)
@click.option(
    "--max-streams",
    default=16384,
    show_default=True,
    type=COUNT,
    help="gRPC calls open at once, all connections together.",
)
@click.option(
    "--max-streams-per-connection",
    default=1024,
    show_default=True,
    type=COUNT,
    help="gRPC calls open at once on one connection.",
)
@click.option(
    "--max-frame-size",
    default="16MiB",
    show_default=True,
    type=Size(64 * KIB, MAX_GRPC_INT),
    help="Largest request: a gRPC message or a produce- or replication-port frame (a batch "
    "of messages); refused from its length, before its body is read.",
)
@click.option(
    "--max-receive-buffer",
    default="64MiB",
    show_default=True,
    type=Size(64 * KIB, 64 * GIB),
    help="Bytes of produce- and replication-port frames still arriving, all "
    "connections together (at least --max-frame-size); a frame that would go over it is "
    "refused.",
)
@click.option(
    "--header-timeout",
    default="10s",
    show_default=True,
    type=Duration(0.01, 3600),
    help="A new connection's handshake (gRPC), producer header (produce port) or first "
    "ReplicaAck (replication port) must arrive within this.",
)
@click.option(
    "--idle-timeout",
    default="10m",
    show_default=True,
    type=Duration(0.1, 7 * DAY),
    help="Close a connection idle this long: gRPC without calls, produce port with "
    "nothing received or answered (an open replication stream is never idle).",
)
@click.option(
    "--startup-verify",
    default="5s",
    show_default=True,
    type=Duration(0, 86_400),
    help="Before serving, read back (checksums) what earlier runs wrote for at most this "
    "long; the rest is verified in the background. Damage found before serving is salvaged "
    "at once; found later, at the next start.",
)
@click.option(
    "--quorum-lease",
    default="1s",
    show_default=True,
    type=Duration(0.01, 3600),
    help="A replicated pchannel's leader that heard from no majority of its replicas for "
    "this long reports itself unhealthy, and the coord moves the leadership (a leader cut "
    "off from its followers). Each follower node sends its leaders a heartbeat every "
    "quarter of this.",
)
@click.option(
    "--produce-listen",
    default="auto",
    show_default=True,
    type=_ListenOr("auto", "off"),
    help="The produce port (Produce over plain TCP frames, lower latency than gRPC): "
    "HOST:PORT, 'auto' (the --listen host, any free port; clients learn it from the node), "
    "or 'off'. Always off when TLS is configured.",
)
@click.option(
    "--replication-listen",
    default="auto",
    show_default=True,
    type=_ListenOr("auto", "off"),
    help="The replication port (followers' Replicate streams over plain TCP frames, less "
    "CPU per replicated record than gRPC): HOST:PORT, 'auto' (the internal listener's "
    "host, any free port; followers learn it from the node) or 'off' (followers use gRPC). "
    "Reach it from peer nodes only: a follower's acks count toward a quorum. Always off "
    "when TLS is configured.",
)
@ACCESS_FILE
@click.option(
    "--probe-listen",
    default="auto",
    show_default=True,
    type=_ListenOr("auto", "off"),
    help="The probe port (liveness pings answered by threads of their own, so that no "
    "data or recovery work delays them; the coord learns it from the node): HOST:PORT, "
    "'auto' (the --listen host, any free port) or 'off' (the coord then judges liveness "
    "by CollectStatus alone). TLS as configured for gRPC.",
)
@click.option(
    "--port-file",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Write the bound port here once serving (for --listen HOST:0).",
)
@LOG_LEVEL
def node(log_level: str, access_file: str | None, **flags) -> None:
    """Run a streaming node: a durable WAL of pchannels served over gRPC.

    `streamwal node list` and `streamwal node drain|undrain ID` ask the coord instead."""
    config = _config(**flags)
    security = server_transport(access_file)
    from streamwal.node.server import NodeServer
    from streamwal.transport import StartupError

    logs.configure(log_level)
    try:
        _run(NodeServer(config, security).serve_forever())
    except StartupError as err:
        raise click.ClickException(str(err)) from None


def _config(
    produce_listen: str,
    probe_listen: str,
    wal_prewarm: int,
    max_message_size: int,
    time_tick_interval: float,
    retention_age: float,
    retention_size: int,
    retention_check_interval: float,
    producer_idle: float,
    producer_window: int,
    txn_keepalive: float,
    txn_max_keepalive: float,
    max_frame_size: int,
    max_receive_buffer: int,
    header_timeout: float,
    idle_timeout: float,
    quorum_lease: float,
    startup_verify: float,
    **same,
) -> NodeConfig:
    """The NodeConfig the flags ask for; a click error (exit status 2) when they do not
    fit together."""
    port_file = same.get("port_file")
    if port_file and not os.path.isdir(os.path.dirname(os.path.abspath(port_file))):
        raise click.BadParameter("its folder does not exist", param_hint="--port-file")
    config = NodeConfig(
        produce_listen=produce_listen,
        probe_listen=probe_listen,
        wal_prewarm_bytes=wal_prewarm,
        max_message_bytes=max_message_size,
        time_tick_interval_s=time_tick_interval,
        default_retention_age_ms=round(retention_age * 1000),
        default_retention_bytes=retention_size,
        retention_check_interval_s=retention_check_interval,
        producer_idle_s=producer_idle,
        max_inflight_bytes_per_producer=producer_window,
        txn_keepalive_s=txn_keepalive,
        txn_max_keepalive_s=txn_max_keepalive,
        max_frame_bytes=max_frame_size,
        max_receive_buffer_bytes=max_receive_buffer,
        header_timeout_s=header_timeout,
        idle_timeout_s=idle_timeout,
        quorum_lease_s=quorum_lease,
        startup_verify_s=startup_verify,
        **same,
    )
    try:
        config.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return config


def _run(coro) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep a fallback
        asyncio.run(coro)


@click.command("wait-drained")
@click.option(
    "--address",
    default="127.0.0.1:19530",
    show_default=True,
    type=Address(),
    help="The local node's gRPC address.",
)
@click.option(
    "--timeout",
    default="25s",
    show_default=True,
    type=Duration(0.1, 3600),
    help="Give up after this long (the pod stops anyway).",
)
@click.option(
    "--settle",
    default="2s",
    show_default=True,
    type=Duration(0, 600),
    help="How long the node must lead nothing, in a row, before the hook returns.",
)
def wait_drained(address: str, timeout: float, settle: float) -> None:
    """Wait until the node leads no pchannel: the chart's preStop hook. The operator drains
    a node whose pod is being deleted (its leaders hand over to caught-up followers, its
    single copies move with their log); waiting here keeps the node serving until then,
    so the kubelet's SIGTERM finds nothing to fail over. Exit 1 on timeout.

    A node that leads nothing at the first look may not be draining yet: the operator
    sees the pod's deletion a moment after the hook starts, and until then the coord may
    still move a leader onto it (a rebalance). So the node must lead nothing for
    `--settle` in a row: one look let a leader arrive after the hook returned."""
    from streamwal import transport
    from streamwal.proto import streaming_pb2 as pb
    from streamwal.proto import streaming_pb2_grpc as pbg

    async def leads() -> int | None:
        async with transport.make_channel(address) as channel:
            stub = pbg.StreamingNodeManagerServiceStub(channel)
            try:
                status = await stub.CollectStatus(
                    pb.StreamingNodeManagerCollectStatusRequest(), timeout=2
                )
            except Exception:  # not answering (yet, or not to this identity): ask again
                return None
        return sum(c.role == pb.REPLICA_ROLE_LEADER for c in status.channels)

    async def run() -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        idle_since: float | None = None
        while loop.time() < deadline:
            if await leads() == 0:
                idle_since = loop.time() if idle_since is None else idle_since
                if loop.time() - idle_since >= settle:
                    return True
            else:
                idle_since = None
            await asyncio.sleep(0.2)
        return False

    if not asyncio.run(run()):
        click.echo(f"the node at {address} still leads pchannels after {timeout:g}s", err=True)
        raise SystemExit(1)
