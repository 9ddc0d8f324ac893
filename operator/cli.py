"""`streamwal operator`: the Kopf operator that turns PChannel resources into assignments."""

from __future__ import annotations

import asyncio
import logging
import os
import random

import click

from streamwal import logs


@click.command("operator")
@click.option(
    "--namespace",
    default=lambda: os.environ.get("POD_NAMESPACE", "default"),
    show_default="$POD_NAMESPACE or default",
    help="Namespace of the PChannels and streaming-node pods.",
)
@click.option(
    "--peering",
    default=None,
    help="Kopf peering object name: replicas sharing it elect one active member.",
)
@click.option(
    "--standalone", is_flag=True, help="No peering: this process is always active (tests)."
)
@click.option(
    "--priority",
    default=None,
    type=int,
    help="Peering priority (default: random, so replicas of equal rank do not all freeze).",
)
@click.option(
    "--node-selector",
    default="app.kubernetes.io/component=streaming-node",
    show_default=True,
    help="Label selector (KEY=VALUE[,...]) of the streaming-node pods.",
)
@click.option(
    "--resync",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds between periodic status checks of each PChannel (drift heals).",
)
@click.option(
    "--coord-listen",
    default=None,
    help="Serve coord gRPC (AssignmentDiscover) on HOST:PORT.",
)
@click.option("--metrics", default=None, help="Serve Prometheus metrics on HOST:PORT.")
@click.option(
    "--liveness",
    default=None,
    help="Kopf liveness endpoint URL, e.g. http://0.0.0.0:8080/healthz.",
)
@click.option(
    "--probe-interval", default=0.5, show_default=True, type=float, help="Node probe interval."
)
@click.option(
    "--grace",
    default=1.5,
    show_default=True,
    type=float,
    help="Seconds without an answer before a node is lost.",
)
@click.option("--log-level", default="info", show_default=True)
def operator(
    namespace: str,
    peering: str | None,
    standalone: bool,
    priority: int | None,
    node_selector: str,
    resync: float,
    coord_listen: str | None,
    metrics: str | None,
    liveness: str | None,
    probe_interval: float,
    grace: float,
    log_level: str,
) -> None:
    """Run the PChannel operator (Kopf): assigns PChannels to streaming-node pods."""
    import kopf

    from streamwal.operator.handlers import build_registry, parse_selector
    from streamwal.operator.runtime import OperatorConfig

    logs.configure(log_level)
    try:
        parse_selector(node_selector)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--node-selector") from None
    if resync <= 0:
        raise click.BadParameter("must be positive", param_hint="--resync")
    if not standalone and not peering:
        standalone = True  # no peering object named: run alone rather than wait for one
    cfg = OperatorConfig(
        namespace=namespace,
        node_selector=node_selector,
        resync=resync,
        coord_listen=coord_listen,
        metrics=metrics,
        probe_interval=probe_interval,
        grace=grace,
    )
    logging.getLogger("kopf").setLevel(max(logging.INFO, logging.getLogger().level))
    asyncio.run(
        kopf.operator(
            registry=build_registry(cfg),
            standalone=standalone,
            peering_name=None if standalone else peering,
            priority=priority if priority is not None else random.randint(1, 1_000_000),
            namespaces=[namespace],
            liveness_endpoint=liveness,
        )
    )
