"""The coord's MetaStore on PChannel status: the Kubernetes API is the source of truth.

Every write is a merge patch of the ``status`` subresource carrying the
``metadata.resourceVersion`` the record was read at, which the API server treats as a
precondition: a stale write gets 409 and becomes `VersionConflict`, the coordinator
re-reads and decides again. So two operators racing can both try, but a term is only ever
written over the version it was computed from, and terms only grow. ``spec`` is never
written; objects are never created here (users create them with kubectl).

Broadcast tasks are ConfigMaps of the same namespace, one per task
(``streamwal-broadcast-<id>``, label ``streamwal.io/broadcast=true``, the serialized
`BroadcastTask` in ``binaryData``), replaced with their ``resourceVersion`` as the
precondition: a 409 is a `VersionConflict` (another operator replica wrote), so the
broadcaster re-reads and decides again.

The sync `kubernetes` client runs in the store's own worker threads (`KubeApi`), behind
one request rate (`--kube-api-qps`, `--kube-api-burst`: a failover of N PChannels is about
2 N status patches and N Events); a 429's Retry-After pauses every call, then the request
is tried again. The Lease's renewals have a thread of their own (lease.py) and no rate:
a burst of status writes never delays them. Cached objects keep only what the operator
reads (name, uid, resourceVersion, generation, spec, status), not `managedFields`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from streamwal.coord.meta_store import MetaStore, Stored, StoredBroadcast, VersionConflict
from streamwal.errors import InvalidArgument, Unavailable
from streamwal.operator import status as st
from streamwal.operator.token_bucket import DEFAULT_BURST, DEFAULT_QPS, Throttled, TokenBucket
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import coord_pb2 as cpb

log = logging.getLogger("streamwal.operator.store")

GROUP, VERSION, PLURAL, KIND = "streamwal.io", "v1alpha1", "pchannels", "PChannel"
Obj = dict[str, Any]
BROADCAST_LABEL, BROADCAST_PREFIX, BROADCAST_KEY = (
    "streamwal.io/broadcast",
    "streamwal-broadcast-",
    "task",
)


def broadcast_config_map(task: bpb.BroadcastTask, version: str | None) -> Obj:
    """The ConfigMap holding `task`; `version` (a resourceVersion) makes a replace guarded."""
    metadata: Obj = {
        "name": f"{BROADCAST_PREFIX}{task.broadcast_id}",
        "labels": {BROADCAST_LABEL: "true", "app.kubernetes.io/managed-by": "streamwal-operator"},
    }
    if version is not None:
        metadata["resourceVersion"] = version
    data = base64.b64encode(task.SerializeToString()).decode()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "binaryData": {BROADCAST_KEY: data}}  # fmt: skip


def broadcast_from_config_map(cm: Any) -> StoredBroadcast:
    """A listed ConfigMap (kubernetes client model) back to the task it holds."""
    data = (cm.binary_data or {}).get(BROADCAST_KEY)
    if data is None:
        raise InvalidArgument(f"ConfigMap {cm.metadata.name} holds no broadcast task")
    task = bpb.BroadcastTask.FromString(base64.b64decode(data))
    return StoredBroadcast(task, cm.metadata.resource_version)


QUEUE_WAIT_S = 60.0  # a request that would wait longer for its slot fails (Unavailable)
THROTTLED_TRIES = 4  # a request the server answers 429 is sent this many times at most
RETRY_AFTER_MAX_S = 10.0
API_THREADS = 4


def _retry_after(err: ApiException) -> float:
    """The 429's Retry-After in seconds (1 when absent or not a number), capped."""
    try:
        seconds = float((err.headers or {}).get("Retry-After", 1))
    except (TypeError, ValueError):
        seconds = 1.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


def _slim(obj: Obj) -> Obj:
    """What the operator reads of a PChannel: `managedFields` alone is often larger than
    the rest, and thousands of PChannels are cached."""
    md = obj["metadata"]
    keep = ("name", "uid", "resourceVersion", "generation")
    return {
        "metadata": {k: md[k] for k in keep if k in md},
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


class KubeApi:
    """Calls of the sync client in worker threads of their own, at a bounded rate,
    counted by call and outcome (`streamwal_operator_kube_requests_total`)."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        timeout: float = 10.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.bucket = TokenBucket(qps, burst, QUEUE_WAIT_S)
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api")
        self.requests = Counter(
            "streamwal_operator_kube_requests_total",
            "Kubernetes API requests of the operator's store and Events, by call and "
            "outcome (ok, an HTTP status, unreachable, or dropped: an Event not sent for "
            "want of a free slot).",
            ["call", "outcome"],
            registry=registry,
        )
        self.throttled = Counter(
            "streamwal_operator_kube_throttled_seconds_total",
            "Seconds requests waited for their slot (--kube-api-qps, --kube-api-burst, "
            "and the server's Retry-After).",
            registry=registry,
        )

    async def call(
        self, fn: Callable[..., Any], *args: Any, droppable: bool = False, **kwargs: Any
    ) -> Any:
        """`fn(*args, **kwargs)` in a worker thread once the rate allows it. `droppable`
        (Events): sent only if a slot is free at once, else Throttled (nothing sent)."""
        loop = asyncio.get_running_loop()
        name = getattr(fn, "__name__", "call")
        tries = 0
        while True:
            tries += 1
            if droppable:
                if not self.bucket.take_now(time.monotonic()):
                    self.requests.labels(name, "dropped").inc()
                    raise Throttled(f"{name}: no free request slot (--kube-api-qps)")
                wait = 0.0
            else:
                try:
                    wait = self.bucket.reserve(time.monotonic())
                except Throttled as err:
                    raise Unavailable(f"Kubernetes API: {err}") from None
            if wait > 0:
                self.throttled.inc(wait)
                await asyncio.sleep(wait)
            work = functools.partial(fn, *args, _request_timeout=self.timeout, **kwargs)
            try:
                out = await loop.run_in_executor(self._pool, work)
            except ApiException as err:
                self.requests.labels(name, str(err.status)).inc()
                if err.status == 429 and tries < THROTTLED_TRIES:
                    self.bucket.pause(time.monotonic(), _retry_after(err))
                    continue
                raise
            except Exception as err:  # connection refused, timeouts: the API is unreachable
                self.requests.labels(name, "unreachable").inc()
                raise Unavailable(f"Kubernetes API: {err}") from err
            self.requests.labels(name, "ok").inc()
            return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class KubeMetaStore(MetaStore):
    """PChannel objects of one namespace; versions are their resourceVersions."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        live_nodes: Callable[[], int] = lambda: 0,
        on_condition: Callable[[str, Obj], None] | None = None,
        calls: KubeApi | None = None,
    ) -> None:
        self.api = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.live_nodes = live_nodes
        self.calls = calls or KubeApi()
        # Told (name, new Ready condition) when a written status changes the condition's
        # reason: the operator turns some into Events (NotEnoughNodes).
        self.on_condition = on_condition
        self.notes: dict[str, st.Note] = {}
        self.objects: dict[str, Obj] = {}  # last seen object per name (uid, generation)
        # The cluster record (incarnation, drains) lives in memory: the incarnation starts
        # from the wall clock in ms so a restarted or failed-over operator publishes newer
        # AssignmentDiscover versions than its predecessor (clocks within seconds).
        self._cluster = cpb.ClusterRecord(incarnation=int(time.time() * 1000))
        self._cluster_version = 0

    async def close(self) -> None:
        self.calls.close()

    def _stored(self, obj: Obj) -> Stored:
        slim = self.objects[obj["metadata"]["name"]] = _slim(obj)
        return Stored(st.record_from_object(slim), slim["metadata"]["resourceVersion"])

    async def list_channels(self) -> list[Stored]:
        listed = await self.calls.call(
            self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL
        )
        items = sorted(listed.get("items", []), key=lambda o: o["metadata"]["name"])
        seen = {o["metadata"]["name"] for o in items}
        for gone in set(self.objects) - seen:
            self.objects.pop(gone, None)
        return [self._stored(o) for o in items]

    async def get_channel(self, name: str) -> Stored | None:
        try:
            obj = await self.calls.call(
                self.api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as err:
            if err.status == 404:
                self.objects.pop(name, None)
                return None
            raise
        return self._stored(obj)

    def desired_status(self, record: cpb.ChannelRecord, obj: Obj) -> Obj:
        name = record.meta.channel.name
        ready = st.ready_condition(record, self.notes.get(name), self.live_nodes())
        return st.status_patch(record, ready, obj)

    async def put_channel(self, record: cpb.ChannelRecord, expected: str | None) -> Stored:
        name = record.meta.channel.name
        obj = self.objects.get(name)
        if expected is None or obj is None:
            raise InvalidArgument(f"{name}: PChannels are created with kubectl, not by the coord")
        status = self.desired_status(record, obj)
        body = {"metadata": {"resourceVersion": expected}, "status": status}
        try:
            out = await self.calls.call(
                self.api.patch_namespaced_custom_object_status,
                GROUP, VERSION, self.namespace, PLURAL, name, body,
                _content_type="application/merge-patch+json",
            )  # fmt: skip
        except ApiException as err:
            if err.status in (404, 409):
                raise VersionConflict(
                    f"{name}: resourceVersion {expected} is stale ({err.status} {err.reason})"
                ) from None
            raise Unavailable(f"{name}: status write failed: {err.status} {err.reason}") from None
        if self.on_condition is not None and st.ready_reason(obj.get("status")) != st.ready_reason(
            status
        ):
            self.on_condition(name, status["conditions"][0])
        return self._stored(out)

    async def remove_annotation(self, name: str, key: str) -> None:
        """Drop annotation `key` of PChannel `name` (a merge patch deletes a null key)."""
        body = {"metadata": {"annotations": {key: None}}}
        await self.calls.call(
            self.api.patch_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURAL, name, body,
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    async def get_cluster(self) -> tuple[cpb.ClusterRecord, str | None]:
        out = cpb.ClusterRecord()
        out.CopyFrom(self._cluster)
        return out, str(self._cluster_version) if self._cluster_version else None

    async def put_cluster(self, record: cpb.ClusterRecord, expected: str | None) -> str:
        current = str(self._cluster_version) if self._cluster_version else None
        if current != expected:
            raise VersionConflict(f"cluster: stored version {current}, expected {expected}")
        self._cluster.CopyFrom(record)
        self._cluster_version += 1
        return str(self._cluster_version)

    async def list_broadcasts(self) -> list[StoredBroadcast]:
        listed = await self.calls.call(
            self.core.list_namespaced_config_map,
            self.namespace,
            label_selector=f"{BROADCAST_LABEL}=true",
        )
        tasks = [broadcast_from_config_map(cm) for cm in listed.items]
        return sorted(tasks, key=lambda s: s.task.broadcast_id)

    async def put_broadcast(self, task: bpb.BroadcastTask, expected: str | None) -> StoredBroadcast:
        bid = task.broadcast_id
        if bid <= 0:
            raise InvalidArgument(f"broadcast id must be positive, got {bid}")
        body = broadcast_config_map(task, expected)
        name = body["metadata"]["name"]
        try:
            if expected is None:
                out = await self.calls.call(
                    self.core.create_namespaced_config_map, self.namespace, body
                )
            else:
                out = await self.calls.call(
                    self.core.replace_namespaced_config_map, name, self.namespace, body
                )
        except ApiException as err:
            if err.status in (404, 409):
                raise VersionConflict(
                    f"broadcast {bid}: resourceVersion {expected} is stale "
                    f"({err.status} {err.reason})"
                ) from None
            raise Unavailable(f"broadcast {bid}: write failed: {err.status} {err.reason}") from None
        return broadcast_from_config_map(out)

    async def delete_broadcast(self, broadcast_id: int) -> None:
        try:
            await self.calls.call(
                self.core.delete_namespaced_config_map,
                f"{BROADCAST_PREFIX}{broadcast_id}",
                self.namespace,
            )
        except ApiException as err:
            if err.status != 404:
                raise Unavailable(
                    f"broadcast {broadcast_id}: delete failed: {err.status} {err.reason}"
                ) from None
