"""The operator's adapter around one Coordinator: Kubernetes store, pods, Events, status.

Kopf handlers (handlers.py) only forward to this object. Decisions stay in the coord's
state machine, balancer and liveness tracker; this module turns Kubernetes facts into the
coordinator's inputs (node set from pods, PChannel objects through the store) and its
outcomes into Kubernetes outputs (status conditions, Events).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from prometheus_client import Gauge

from streamwal.coord.coordinator import CoordConfig, Coordinator
from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL
from streamwal.coord.meta_store import VersionConflict
from streamwal.coord.metrics import CoordMetrics
from streamwal.coord.pinger import Pinger
from streamwal.coord.server import serve_metrics, start_grpc
from streamwal.errors import InvalidArgument, StreamingError
from streamwal.operator import pods as podlib
from streamwal.operator import status as st
from streamwal.operator.kube_meta_store import GROUP, KIND, VERSION, KubeApi, KubeMetaStore
from streamwal.operator.token_bucket import DEFAULT_BURST, DEFAULT_QPS, Throttled
from streamwal.tasks import cancel_and_wait
from streamwal.transport import TransportConfig

log = logging.getLogger("streamwal.operator")

# `kubectl annotate pch NAME streamwal.io/accept-data-loss=true`: the Kubernetes face of
# `streamwal channel accept-loss` (a one-shot action, removed once carried out).
ACCEPT_DATA_LOSS = "streamwal.io/accept-data-loss"

STANDBY = "this operator replica is not the active one"
# A broadcast store that failed to load (say, the ConfigMap API refused) is retried.
BROADCAST_RETRY_SECONDS = 5.0


@dataclass
class OperatorConfig:
    namespace: str
    node_selector: str = "app.kubernetes.io/component=streaming-node"
    resync: float = 30.0
    coord_listen: str | None = None
    metrics: str | None = None
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    grace: float = DEFAULT_GRACE
    # The coord server's TLS and access rules (--access-file); None: STREAMWAL_TLS_*.
    security: TransportConfig | None = None
    # The store's and Events' request rate against the API server (not the Lease's).
    kube_api_qps: float = DEFAULT_QPS
    kube_api_burst: int = DEFAULT_BURST


def load_api() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()


class OperatorRuntime:
    """The coordinator over PChannel objects; it reconciles only while `lead()` holds.

    Every replica keeps its view fresh (Kopf's watches feed `pchannel_event` and
    `pod_event`) and serves AssignmentDiscover from it; only the elected one writes.
    """

    def __init__(self, cfg: OperatorConfig) -> None:
        self.cfg = cfg
        self.api = load_api()
        self.core = client.CoreV1Api(self.api)
        metrics = CoordMetrics()
        self.store = KubeMetaStore(
            self.api,
            cfg.namespace,
            live_nodes=self._live_count,
            on_condition=self._on_condition,
            calls=KubeApi(cfg.kube_api_qps, cfg.kube_api_burst, registry=metrics.registry),
        )
        config = CoordConfig(nodes={}, probe_interval=cfg.probe_interval, grace=cfg.grace)
        self.coord = Coordinator(
            self.store,
            config,
            metrics=metrics,
            pinger=Pinger(config.probe_interval, config.max_loop_stall),
        )
        self.coord.listener = self._on_outcome
        self.coord.active = False
        # Broadcasts are driven by the active replica only (started by `lead`).
        self.coord.broadcaster.held = STANDBY
        self.pods: dict[str, dict[str, Any]] = {}
        # What Prometheus compares the serving replicas with (the under-replicated alert).
        self.replicas_wanted = Gauge(
            "streamwal_pchannel_replicas_wanted",
            "spec.replicas of every PChannel.",
            ["pchannel"],
            registry=self.coord.metrics.registry,
        )
        self._wanted: dict[str, int] = {}
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self._server = None
        self._refresh_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _live_count(self) -> int:
        return len(self.coord.tracker.live())

    @property
    def active(self) -> bool:
        return self.coord.active

    async def start(self) -> None:
        await self.coord.start()
        if self.cfg.coord_listen:
            self._server, _health, self.grpc_port = await start_grpc(
                self.coord, self.cfg.coord_listen, channel_service=False, security=self.cfg.security
            )
        if self.cfg.metrics:
            self.metrics_port = serve_metrics(self.coord, self.cfg.metrics)
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="operator-refresh"),
            asyncio.create_task(self._resync_loop(), name="operator-resync"),
        ]
        log.info(
            "operator started",
            extra={"namespace": self.cfg.namespace, "coord_port": self.grpc_port,
                   "metrics_port": self.metrics_port},
        )  # fmt: skip

    async def stop(self) -> None:
        self.coord.active = False
        await cancel_and_wait(self._tasks)
        if self._server is not None:
            await self._server.stop(grace=1.0)
        await self.coord.stop()
        await self.store.close()
        self.api.close()

    async def lead(self) -> None:
        """This replica was elected: reconcile from a fresh read, drive broadcasts."""
        log.info("operator active: reconciling")
        with suppress(StreamingError):
            await self._refresh()
        self.coord.active = True
        self.coord.wake()
        self._spawn(self._start_broadcasts())

    async def stop_acting(self) -> None:
        """Leadership is lost: no reconcile round, no broadcast from now on."""
        self.coord.active = False
        self.coord.broadcaster.held = STANDBY
        await self.coord.broadcaster.stop(STANDBY)

    async def _start_broadcasts(self) -> None:
        """Load the broadcast ConfigMaps and resume pending tasks (retried while leading).

        Reconciling PChannels does not wait for this: a failing ConfigMap API (say, a chart
        without the ConfigMap rule) only leaves broadcasts answering OnShutdown.
        """
        while self.coord.active:
            self.coord.broadcaster.held = None
            try:
                await self.coord.broadcaster.start()
                return
            except Exception as err:  # API unreachable or forbidden: stay standby, retry
                self.coord.broadcaster.held = STANDBY
                log.warning("broadcast tasks not loaded", extra={"error": str(err)})
            await asyncio.sleep(BROADCAST_RETRY_SECONDS)

    # ----------------------------------------------------------------- inputs

    def request_refresh(self) -> None:
        self._refresh_wanted.set()

    async def _refresh(self) -> None:
        """Re-list PChannels into the coordinator; export their wanted replica counts."""
        await self.coord.refresh()
        wanted = {
            name: int((obj.get("spec") or {}).get("replicas") or 1)
            for name, obj in self.store.objects.items()
        }
        for gone in self._wanted.keys() - wanted.keys():
            self.replicas_wanted.remove(gone)
        for name, count in wanted.items():
            self.replicas_wanted.labels(name).set(count)
        self._wanted = wanted

    async def _refresh_loop(self) -> None:
        """Re-list PChannels after changes, at most every 0.2 s (events come in bursts)."""
        while True:
            await self._refresh_wanted.wait()
            self._refresh_wanted.clear()
            try:
                await self._refresh()
            except Exception:
                log.exception("refresh failed")
            await asyncio.sleep(0.2)

    async def _resync_loop(self) -> None:
        """Every `resync` seconds: re-list, and heal every status that drifted."""
        while True:
            await asyncio.sleep(self.cfg.resync)
            if not self.coord.active:
                continue
            try:
                await self._refresh()
                for name in list(self.store.objects):
                    await self.heal(name)
            except StreamingError as err:
                log.warning("resync failed", extra={"error": str(err)})

    async def pchannel_event(self, name: str, body: dict[str, Any]) -> None:
        """A PChannel changed: refresh the view; a new generation is acknowledged at once."""
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if self.coord.active and annotations.get(ACCEPT_DATA_LOSS) == "true":
            await self._accept_data_loss(name)
        generation = (body.get("metadata") or {}).get("generation")
        observed = (body.get("status") or {}).get("observedGeneration")
        if self.coord.active and generation and observed is not None and generation != observed:
            try:
                await self.heal(name, refresh=True)
            except StreamingError as err:
                log.warning("heal failed", extra={"pchannel": name, "error": str(err)})
        self.request_refresh()

    async def _accept_data_loss(self, name: str) -> None:
        """The user accepts that a single copy lost acknowledged records (see the DataLoss
        condition): it is served again above every acknowledged offset; the annotation
        goes once that is done, or at once when there is no loss to accept."""
        try:
            await self.coord.accept_data_loss(name)
        except InvalidArgument as err:  # nothing to accept (any more)
            log.info(
                "accept-data-loss annotation ignored", extra={"pchannel": name, "why": str(err)}
            )
        except StreamingError as err:
            log.warning(
                "accepting the data loss failed", extra={"pchannel": name, "error": str(err)}
            )
            return
        else:
            self.store.notes.pop(name, None)
            self._spawn(
                self.post_event(
                    name,
                    "DataLossAccepted",
                    "served again above every acknowledged offset",
                    "Warning",
                )
            )
        await self.store.remove_annotation(name, ACCEPT_DATA_LOSS)

    def pod_event(self, kind: str | None, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        pods = list(self.pods.values())
        self.coord.set_nodes(podlib.nodes_from_pods(pods), *podlib.placement_attrs(pods))
        self.coord.set_draining(podlib.draining(pods))

    async def heal(self, name: str, refresh: bool = False) -> None:
        """Rewrite status when it differs from what it should say (generation, condition)."""
        if refresh:
            await self._refresh()
        obj = self.store.objects.get(name)
        if obj is None:
            self.request_refresh()
            return
        desired = self.store.desired_status(st.record_from_object(obj), obj)
        if st.status_differs(obj.get("status") or {}, desired):
            try:
                await self.coord.touch(name)
            except VersionConflict:
                self.request_refresh()

    # ----------------------------------------------------------------- outputs

    def _on_outcome(self, kind: str, name: str, fields: dict) -> None:
        if kind in ("assigned", "failover"):
            if self.store.notes.get(name, st.Note("", "")).reason != st.UNSCHEDULABLE:
                self.store.notes.pop(name, None)
            reason = "Failover" if kind == "failover" else "Assigned"
            message = (
                f"assigned to node {fields['new_node']} under term {fields['new_term']}"
                + (f" (was node {fields['old_node']}, term {fields['old_term']})"
                   if fields.get("old_node") is not None else "")
            )  # fmt: skip
            self._spawn(self.post_event(name, reason, message, "Normal"))
        elif kind == "assign-failed":
            message = (
                f"assign to node {fields['node']} under term {fields['term']} failed: "
                f"{fields['error']}"
            )
            self.store.notes[name] = st.Note("AssignFailed", message)
            self._spawn(self.post_event(name, "AssignFailed", message, "Warning"))
            self._spawn(self._touch_later(name))
        elif kind == "unclean-failover":
            message = (
                f"moved off lost node {fields.get('old_node')} without catch-up: records it "
                f"acknowledged at or after offset {fields.get('min_next_offset')} are stranded"
            )
            self._spawn(self.post_event(name, "UncleanFailover", message, "Warning"))
        elif kind == "data-loss":
            message = (
                f"the only copy lost acknowledged records: {fields.get('cause')}; it is not "
                f"served until the loss is accepted: kubectl annotate pch {name} "
                f"{ACCEPT_DATA_LOSS}=true"
            )
            self.store.notes[name] = st.Note("DataLoss", message)
            self._spawn(self.post_event(name, "DataLoss", message, "Warning"))
            self._spawn(self._touch_later(name))
        elif kind == "unschedulable":
            if fields["reason"]:
                self.store.notes[name] = st.Note(st.UNSCHEDULABLE, fields["reason"])
                self._spawn(self.post_event(name, st.UNSCHEDULABLE, fields["reason"], "Warning"))
            elif self.store.notes.get(name, st.Note("", "")).reason == st.UNSCHEDULABLE:
                self.store.notes.pop(name, None)
            self._spawn(self._touch_later(name))
        elif kind == "unavailable" and fields.get("code"):
            # Waiting for the node with its only copy: the condition says so from the
            # record (status.ready_condition), the Event says it once.
            self._spawn(self.post_event(name, fields["code"], fields["reason"], "Warning"))
        elif kind == "unavailable":
            message = f"node {fields.get('node')} lost and no live node can take the pchannel"
            self._spawn(self.post_event(name, "Unavailable", message, "Warning"))

    def _on_condition(self, name: str, condition: dict[str, Any]) -> None:
        """A status write changed the Ready reason: some reasons are worth an Event."""
        if condition["reason"] == st.NOT_ENOUGH_NODES:
            self._spawn(self.post_event(name, st.NOT_ENOUGH_NODES, condition["message"], "Warning"))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

    async def _touch_later(self, name: str) -> None:
        with suppress(StreamingError):
            await self.coord.touch(name)

    async def post_event(self, name: str, reason: str, message: str, kind: str) -> None:
        """A core/v1 Event on the PChannel (what `kubectl describe pch` shows)."""
        obj = self.store.objects.get(name) or {"metadata": {"name": name}}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": self.cfg.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": name,
                "namespace": self.cfg.namespace,
                "uid": obj["metadata"].get("uid"),
                "resourceVersion": obj["metadata"].get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "streamwal-operator"},
            "reportingComponent": "streamwal-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.store.calls.call(
                self.core.create_namespaced_event, self.cfg.namespace, body, droppable=True
            )
        except Throttled:  # counted (outcome "dropped"): status writes go first
            return
        except Exception as err:  # an Event is informative; never let it break a round
            log.warning("event not posted", extra={"pchannel": name, "error": str(err)})
