"""`streamwal node`: run a streaming node."""

from __future__ import annotations

import asyncio

import click

from streamwal import logs
from streamwal.node.config import NodeConfig
from streamwal.units import parse_duration_ms, parse_size


@click.command("node")
@click.option("--listen", default="127.0.0.1:19530", show_default=True, help="gRPC HOST:PORT.")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False), help="RocksDB folder.")
@click.option(
    "--node-id", default=1, show_default=True, type=int, help="Server id reported to coord."
)
@click.option("--metrics", default=None, help="Serve Prometheus metrics on HOST:PORT.")
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
@click.option("--max-message-size", default="4MiB", show_default=True, help="Largest message.")
@click.option(
    "--time-tick-interval", default="200ms", show_default=True, help="Idle time-tick period."
)
@click.option(
    "--retention-age", default="0", show_default=True, help="Default max age, e.g. 7d (0: forever)."
)
@click.option(
    "--retention-size",
    default="0",
    show_default=True,
    help="Default max bytes per pchannel, e.g. 10GiB (0: unlimited).",
)
@click.option(
    "--retention-check-interval",
    default="5s",
    show_default=True,
    help="How often retention bounds are applied.",
)
@click.option(
    "--producer-idle",
    default="10m",
    show_default=True,
    help="An idempotent producer's state leaves memory after this long unused (checked "
    "with retention); its window stays on disk and is read again if it returns.",
)
@click.option(
    "--producer-window",
    default="64MiB",
    show_default=True,
    help="Bytes one producer may have awaiting their acknowledgement; beyond it the node "
    "stops reading that producer's stream until acks free room (TCP slows the producer).",
)
@click.option(
    "--txn-keepalive",
    default="10s",
    show_default=True,
    help="A txn without an append for this long expires (rolled back); clients may set "
    "their own per txn.",
)
@click.option("--txn-max-bytes", default="16MiB", show_default=True, help="Buffered bytes per txn.")
@click.option(
    "--txn-max-open", default=1024, show_default=True, type=int, help="Open txns per node."
)
@click.option(
    "--startup-verify",
    default="5s",
    show_default=True,
    help="Before serving, read back (checksums) what earlier runs wrote for at most this "
    "long; the rest is verified in the background. Damage found before serving is salvaged "
    "at once; found later, at the next start.",
)
@click.option(
    "--quorum-lease",
    default="1s",
    show_default=True,
    help="A replicated pchannel's leader that heard from no majority of its replicas for "
    "this long reports itself unhealthy, and the coord moves the leadership (a leader cut "
    "off from its followers). Followers are heard at least every --time-tick-interval.",
)
@click.option(
    "--produce-listen",
    default="auto",
    show_default=True,
    help="The produce port (Produce over plain TCP frames, lower latency than gRPC): "
    "HOST:PORT, 'auto' (the --listen host, any free port; clients learn it from the node), "
    "or 'off'. Always off when TLS is configured.",
)
@click.option(
    "--port-file",
    default=None,
    help="Write the bound port here once serving (for --listen HOST:0).",
)
@click.option("--log-level", default="info", show_default=True)
def node(
    listen: str,
    data_dir: str,
    node_id: int,
    metrics: str | None,
    durability: str,
    wal_prewarm: str,
    compaction_priority: str,
    max_message_size: str,
    time_tick_interval: str,
    retention_age: str,
    retention_size: str,
    retention_check_interval: str,
    producer_idle: str,
    producer_window: str,
    txn_keepalive: str,
    txn_max_bytes: str,
    txn_max_open: int,
    startup_verify: str,
    quorum_lease: str,
    produce_listen: str,
    port_file: str | None,
    log_level: str,
) -> None:
    """Run a streaming node: a durable WAL of pchannels served over gRPC."""
    from streamwal.node.server import NodeServer

    logs.configure(log_level)
    config = NodeConfig(
        listen=listen,
        data_dir=data_dir,
        node_id=node_id,
        metrics=metrics,
        durability=durability,
        wal_prewarm_bytes=parse_size(wal_prewarm),
        compaction_priority=compaction_priority,
        max_message_bytes=parse_size(max_message_size),
        time_tick_interval_s=parse_duration_ms(time_tick_interval) / 1000,
        default_retention_age_ms=parse_duration_ms(retention_age),
        default_retention_bytes=parse_size(retention_size),
        retention_check_interval_s=parse_duration_ms(retention_check_interval) / 1000,
        producer_idle_s=parse_duration_ms(producer_idle) / 1000,
        max_inflight_bytes_per_producer=parse_size(producer_window),
        txn_keepalive_s=parse_duration_ms(txn_keepalive) / 1000,
        txn_max_bytes=parse_size(txn_max_bytes),
        txn_max_open=txn_max_open,
        startup_verify_s=parse_duration_ms(startup_verify) / 1000,
        quorum_lease_s=parse_duration_ms(quorum_lease) / 1000,
        produce_listen=produce_listen,
        port_file=port_file,
    )
    _run(NodeServer(config).serve_forever())


def _run(coro) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep a fallback
        asyncio.run(coro)
