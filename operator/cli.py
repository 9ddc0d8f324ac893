"""`streamwal operator`: the Kopf operator that turns PChannel resources into assignments."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
import threading
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import click

from streamwal import logs
from streamwal.cli import ACCESS_FILE, LOG_LEVEL, SECONDS, Address, server_transport
from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL
from streamwal.operator.token_bucket import DEFAULT_BURST, DEFAULT_QPS
from streamwal.tasks import cancel_and_wait

if TYPE_CHECKING:  # kopf and kubernetes are optional (streamwal[kube]): imported when run
    from streamwal.operator.election import ElectionConfig
    from streamwal.operator.runtime import OperatorConfig


class _KopfSettingsFilter(logging.Filter):
    """Kopf attaches its whole settings object to every record; the JSON lines drop it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("settings", None)
        return True


def quiet_kopf() -> None:
    """Kopf at INFO for the framework, WARNING per object (a line per event otherwise)."""
    logging.getLogger("kopf").setLevel(max(logging.INFO, logging.getLogger().level))
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLogger().level))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_KopfSettingsFilter())


def default_identity() -> str:
    """The pod's name in a cluster (a restarted container takes its Lease back at once),
    else host, pid and a random suffix (several operators on one machine: tests)."""
    return os.environ.get("POD_NAME") or (
        f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def _kube_name(pattern: re.Pattern, what: str):
    def check(_ctx, _param, value: str | None) -> str | None:
        if value is not None and not pattern.match(value):
            raise click.BadParameter(f"{value!r} is not a Kubernetes {what}")
        return value

    return check


def _http_url(_ctx, _param, value: str | None) -> str | None:
    """http(s)://HOST[:PORT]/PATH, the port 1..65535."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise click.BadParameter(f"{value!r} is not an http(s)://HOST[:PORT]/PATH URL")
    return value


@click.command("operator")
@click.option(
    "--namespace",
    default=lambda: os.environ.get("POD_NAMESPACE", "default"),
    show_default="$POD_NAMESPACE or default",
    callback=_kube_name(_DNS_LABEL, "namespace name (a DNS-1123 label)"),
    help="Namespace of the PChannels, the streaming-node pods and the Lease.",
)
@click.option(
    "--lease",
    default=None,
    callback=_kube_name(_DNS_NAME, "object name (a DNS-1123 subdomain)"),
    help="Name of the coordination.k8s.io Lease the replicas elect their one active member "
    "with. Without it this process acts alone (one replica only).",
)
@click.option(
    "--lease-duration",
    default=15.0,
    show_default=True,
    type=SECONDS,
    help="Seconds a standby waits after the leader's last renewal before taking over.",
)
@click.option(
    "--renew-deadline",
    default=10.0,
    show_default=True,
    type=SECONDS,
    help="Seconds the leader keeps acting without renewing; then it stops and exits.",
)
@click.option(
    "--retry-period",
    default=2.0,
    show_default=True,
    type=SECONDS,
    help="Seconds between the leader's renewals and the standbys' reads of the Lease.",
)
@click.option(
    "--identity",
    default=default_identity,
    show_default="$POD_NAME, else host-pid-random",
    help="This replica's name in the Lease.",
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
    type=click.FloatRange(0.1, 86_400.0),
    help="Seconds between periodic status checks of every PChannel (drift heals).",
)
@click.option(
    "--coord-listen",
    default=None,
    type=Address(listen=True),
    help="Serve coord gRPC (AssignmentDiscover) on HOST:PORT.",
)
@click.option(
    "--metrics",
    default=None,
    type=Address(listen=True),
    help="Serve Prometheus metrics on HOST:PORT.",
)
@click.option(
    "--liveness",
    default=None,
    callback=_http_url,
    help="Kopf liveness endpoint URL, e.g. http://0.0.0.0:8080/healthz.",
)
@click.option(
    "--probe-interval",
    default=DEFAULT_PROBE_INTERVAL,
    show_default=True,
    type=SECONDS,
    help="Node probe interval.",
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
    "--kube-api-qps",
    default=DEFAULT_QPS,
    show_default=True,
    type=click.FloatRange(0.1, 10_000.0),
    help="Kubernetes API requests per second of the PChannel status writes, reads and "
    "Events, on average (a failover of N PChannels is about 3 N requests; the Lease's "
    "renewals are not counted).",
)
@click.option(
    "--kube-api-burst",
    default=DEFAULT_BURST,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="How many of those requests may go at once after a quiet spell.",
)
@ACCESS_FILE
@LOG_LEVEL
def operator(
    namespace: str,
    lease: str | None,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    identity: str,
    node_selector: str,
    resync: float,
    coord_listen: str | None,
    metrics: str | None,
    liveness: str | None,
    probe_interval: float,
    grace: float,
    kube_api_qps: float,
    kube_api_burst: int,
    access_file: str | None,
    log_level: str,
) -> None:
    """Run the PChannel operator (Kopf): assigns PChannels to streaming-node pods.

    Replicas sharing a --lease elect one active member; the others keep a fresh view
    (they serve AssignmentDiscover) and take over when the leader's Lease expires. A
    leader that cannot renew for --renew-deadline stops acting and exits (code 1).
    """
    if access_file and not coord_listen:
        raise click.BadParameter("rules for a coord server: give --coord-listen too",
                                 param_hint="--access-file")  # fmt: skip
    security = server_transport(access_file) if coord_listen else None
    from streamwal.operator.election import ElectionConfig
    from streamwal.operator.handlers import parse_selector
    from streamwal.operator.runtime import OperatorConfig

    logs.configure(log_level)
    try:
        parse_selector(node_selector)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--node-selector") from None
    try:
        election = ElectionConfig(lease_duration, renew_deadline, retry_period)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--lease-duration") from None
    cfg = OperatorConfig(
        namespace=namespace,
        node_selector=node_selector,
        resync=resync,
        coord_listen=coord_listen,
        metrics=metrics,
        probe_interval=probe_interval,
        grace=grace,
        security=security,
        kube_api_qps=kube_api_qps,
        kube_api_burst=kube_api_burst,
    )
    quiet_kopf()
    sys.exit(asyncio.run(run(cfg, lease, election, identity, liveness)))


async def run(
    cfg: OperatorConfig,
    lease: str | None,
    election: ElectionConfig,
    identity: str,
    liveness: str | None,
) -> int:
    """Kopf's watches and the runtime on every replica; acting only while elected.

    Kopf runs in a thread with its own event loop (its handlers hand the events over to
    this loop): it owns every task of its loop and waits for them, or cancels them, when
    it stops, which must not touch the runtime's gRPC calls and reconcile rounds.

    Returns the exit code: 0 after a clean stop (SIGTERM or SIGINT: Kopf stops, the
    Lease is released), 1 when leadership was lost (the runtime stopped acting at that
    moment) or Kopf failed.
    """
    import kopf

    from streamwal.operator.handlers import build_registry, settings
    from streamwal.operator.lease import LeaseElector
    from streamwal.operator.runtime import OperatorRuntime

    log = logging.getLogger("streamwal.operator")
    loop = asyncio.get_running_loop()
    runtime = OperatorRuntime(cfg)
    await runtime.start()
    stop_kopf = threading.Event()

    watching: asyncio.Future[BaseException | None] = loop.create_future()

    def watch() -> None:  # a thread of its own, not one of the default executor's few
        failure: BaseException | None = None
        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(runtime, loop),
                    settings=settings(),
                    standalone=True,  # the active replica is chosen by our Lease
                    namespaces=[cfg.namespace],
                    liveness_endpoint=liveness,
                    stop_flag=stop_kopf,
                )
            )
        except BaseException as err:
            failure = err
        loop.call_soon_threadsafe(watching.set_result, failure)

    threading.Thread(target=watch, name="kopf", daemon=True).start()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    signals = asyncio.create_task(stopping.wait(), name="signals")
    waits: set[asyncio.Future] = {watching, signals}
    elector = campaign = None
    if lease:
        elector = LeaseElector(runtime.api, cfg.namespace, lease, identity, election, runtime.lead)
        campaign = asyncio.create_task(elector.run(), name="lease")
        waits.add(campaign)
        log.info("campaigning", extra={"lease": lease, "identity": identity})
    else:
        await runtime.lead()
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    lost = campaign is not None and campaign.done()
    if lost:
        await runtime.stop_acting()
    elif campaign is not None:
        await cancel_and_wait([campaign])
    await cancel_and_wait([signals])
    stop_kopf.set()
    failed = await watching is not None
    if elector is not None and not lost:
        await elector.release()
    await runtime.stop()
    return 1 if lost or failed else 0
