"""A Kubernetes API server emulator for tests, run in its own thread on a loopback port.

No real kube-apiserver can run here, and mocks that only answer canned requests hide
exactly the behaviour an operator's correctness depends on. This emulator keeps the
parts of the API contract that clients rely on:

* discovery (``/api``, ``/apis``, group versions) and OpenAPI v3 (so ``kubectl apply``
  validates server-side and ``kubectl explain`` works), ``/version``;
* CRUD with PUT, merge / strategic-merge / JSON patch (``test`` ops included) and a
  server-side-apply approximation; ``dryRun``;
* ``metadata.resourceVersion`` on every object, 409 on stale writes, no-op writes that do
  not bump it, ``generation`` bumped on spec changes only, the status subresource (main
  writes ignore status, status writes ignore everything else);
* lists with ``kind`` and ``metadata.resourceVersion``, ``limit``/``continue``, label and
  field selectors; watches with resume from a resourceVersion, 410 Gone once history is
  compacted, ``timeoutSeconds``, bookmarks and ``sendInitialEvents``;
* CRDs that become served types, with structural-schema pruning, defaulting, validation
  (CEL rules included) and printer columns in Table responses;
* namespaces, finalizers and ``deletionTimestamp``.

Built-in kinds (Pods, Services, Events, ...) are stored generically: nothing runs them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import re
import secrets
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from . import kopenapi, kpatch, kschema, kselect
from .builtin import BUILTINS, ResourceType, check_crd, types_from_crd

Obj = dict[str, Any]
TABLE_MARK = "as=Table"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY = ("", "namespaces")


class ApiError(Exception):
    """An error the API answers with a ``Status`` object."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, as kubectl prints ages."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    return f"{d}d{h % 24}h" if d < 8 and h % 24 else f"{d}d"


@dataclass
class Event:
    rv: int
    key: tuple[str, str]
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    prev: Obj | None


@dataclass(eq=False)
class Watcher:
    key: tuple[str, str]
    namespace: str | None
    match: Callable[[Obj], bool]
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)

    def translate(self, ev: Event) -> tuple[str, Obj] | None:
        """What this watcher sees of an event (selector transitions become ADDED/DELETED)."""
        if ev.key != self.key:
            return None
        if self.namespace and ev.obj["metadata"].get("namespace") != self.namespace:
            return None
        now = self.match(ev.obj)
        before = ev.prev is not None and self.match(ev.prev)
        if ev.type == "MODIFIED":
            if now and before:
                return "MODIFIED", ev.obj
            if now:
                return "ADDED", ev.obj
            if before:
                return "DELETED", ev.obj
            return None
        return (ev.type, ev.obj) if now else None


class Store:
    """Objects, the global resourceVersion counter, the event history and the watchers.

    Lives entirely on the emulator's event loop, so no locking is needed.
    """

    def __init__(self, history: int) -> None:
        self.rv = 1
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.events: deque[Event] = deque()
        self.history = history
        self.compacted_rv = 0  # watches from an older resourceVersion get 410 Gone
        self.watchers: set[Watcher] = set()

    def bucket(self, key: tuple[str, str]) -> dict[tuple[str, str], Obj]:
        return self.objects.setdefault(key, {})

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def record(self, key: tuple[str, str], kind: str, obj: Obj, prev: Obj | None) -> None:
        ev = Event(
            int(obj["metadata"]["resourceVersion"]),
            key,
            kind,
            copy.deepcopy(obj),
            copy.deepcopy(prev) if prev else None,
        )
        self.events.append(ev)
        while len(self.events) > self.history:
            self.compacted_rv = self.events.popleft().rv
        for w in list(self.watchers):
            seen = w.translate(ev)
            if seen:
                w.queue.put_nowait({"type": seen[0], "object": seen[1]})

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does."""
        self.events.clear()
        self.compacted_rv = self.rv


class KubeEmulator:
    """The emulated API server. ``start()`` serves it on ``url`` from a daemon thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        history: int = 10_000,
        bookmark_interval: float = 5.0,
    ) -> None:
        self.host, self.port = host, port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in BUILTINS:
            self._register(rt)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._openapi_cache: dict[str, Any] | None = None
        for ns in ("default", "kube-system", "kube-public"):
            self._create(
                self._type("", "v1", "namespaces"),
                None,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> KubeEmulator:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="kube-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"kube emulator did not start: {failure}")
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        """End every watch stream, close the server and join the thread."""
        if not self._loop or not self._thread:
            return

        def end_watches() -> None:
            for w in self.store.watchers:
                w.queue.put_nowait(None)

        self._loop.call_soon_threadsafe(end_watches)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the emulator's loop (the store is not thread-safe) and return."""
        if self._loop is None:
            return fn(*args)

        async def wrapped() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(10)

    def compact(self) -> None:
        """Drop the watch history: resuming from any older resourceVersion gets 410 Gone."""
        self.call(self.store.compact)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """Write a kubeconfig that points kubectl / clients / Kopf at this emulator."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------------ types

    def _register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self._openapi_cache = None

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def _sync_crd(self, crd: Obj | None, name: str) -> None:
        """Serve exactly the versions a CRD now defines (none once it is gone)."""
        for key in [k for k, rt in self.types.items() if rt.crd == name]:
            del self.types[key]
        if crd is not None:
            for rt in types_from_crd(crd):
                self._register(rt)
        else:
            self._openapi_cache = None

    def _openapi(self) -> dict[str, Any]:
        if self._openapi_cache is None:
            types = list(self.types.values())
            docs = kopenapi.v3_documents(types)
            self._openapi_cache = {
                "docs": docs,
                "root": kopenapi.v3_root(docs),
                "v2": kopenapi.v2_document(types),
            }
        return self._openapi_cache

    # ------------------------------------------------------------------ HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except ApiError as err:
            return web.json_response(err.status(), status=err.code)
        except kselect.SelectorError as err:
            return web.json_response(ApiError(400, "BadRequest", str(err)).status(), status=400)
        except Exception as err:  # a bug here must show in the test, not hang a client
            return web.json_response(
                ApiError(500, "InternalError", f"emulator error: {err!r}").status(), status=500
            )

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.method == "GET":
            simple = self._simple_get(parts)
            if simple is not None:
                return web.json_response(simple)
            if parts[:2] == ["openapi", "v2"]:
                if "json" not in request.headers.get("Accept", "json"):
                    raise ApiError(406, "NotAcceptable", "only application/json is served")
                return web.json_response(self._openapi()["v2"])
        if parts and parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts and parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = None
        served = {
            rt.plural for rt in self.types.values() if rt.group == group and rt.version == version
        }
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] in served:
            namespace, rest = rest[1], rest[2:]
        rt = self._type(group, version, rest[0])
        if namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status") or (sub == "status" and not rt.status) or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self._resource(request, rt, namespace, name, sub)

    def _simple_get(self, parts: list[str]) -> Any:
        """Discovery, version, health and OpenAPI documents (None: not one of those)."""
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return "ok"
        if parts == ["version"]:
            return {
                "major": "1",
                "minor": "33",
                "gitVersion": "v1.33.0-streamwal-emulator",
                "platform": "linux/amd64",
                "goVersion": "go1.24",
            }
        if parts == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                ],
            }
        if parts == ["apis"]:
            groups: dict[str, list[str]] = {}
            for rt in self.types.values():
                if rt.group and rt.version not in groups.setdefault(rt.group, []):
                    groups[rt.group].append(rt.version)
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in sorted(groups.items())
                ],
            }
        if len(parts) == 2 and parts[0] == "apis":
            versions = sorted({rt.version for rt in self.types.values() if rt.group == parts[1]})
            if not versions:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            gv = [{"groupVersion": f"{parts[1]}/{v}", "version": v} for v in versions]
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": parts[1],
                "versions": gv,
                "preferredVersion": gv[0],
            }
        gv_parts = parts[1:] if parts[:1] in (["api"], ["apis"]) else None
        if gv_parts and (
            (parts[0] == "api" and len(parts) == 2) or (parts[0] == "apis" and len(parts) == 3)
        ):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            types = [
                rt for rt in self.types.values() if rt.group == group and rt.version == version
            ]
            if not types:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            resources = [e for rt in sorted(types, key=lambda t: t.plural) for e in rt.discovery()]
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources,
            }
        if parts == ["openapi", "v3"]:
            return self._openapi()["root"]
        if parts[:2] == ["openapi", "v3"] and len(parts) > 2:
            doc = self._openapi()["docs"].get("/".join(parts[2:]))
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return doc
        return None

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        ctype = request.content_type
        if "protobuf" in ctype:
            raise ApiError(415, "UnsupportedMediaType", f"the body of type {ctype} is not served")
        try:
            return yaml.safe_load(raw) if "yaml" in ctype else json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"invalid request body: {exc}") from None

    async def _resource(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str | None,
        sub: str | None,
    ) -> web.StreamResponse:
        q = request.query
        method = request.method
        as_table = TABLE_MARK in request.headers.get("Accept", "")
        if name is None:
            if method == "GET" and q.get("watch") in ("true", "1"):
                return await self._watch(request, rt, namespace, as_table)
            if method == "GET":
                listed = self._list(rt, namespace, q)
                return web.json_response(
                    self._table(rt, listed["items"], listed["metadata"], q) if as_table else listed
                )
            if method == "POST":
                body = await self._body(request)
                created = self._create(
                    rt,
                    namespace,
                    body,
                    dry=bool(q.get("dryRun")),
                    strict=q.get("fieldValidation") == "Strict",
                )
                return web.json_response(created, status=201)
            if method == "DELETE":
                return web.json_response(self._delete_collection(rt, namespace, q))
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
        if method == "GET":
            obj = self._get(rt, namespace, name)
            return web.json_response(
                self._table(rt, [obj], {"resourceVersion": str(self.store.rv)}, q)
                if as_table
                else obj
            )
        if method == "PUT":
            body = await self._body(request)
            return web.json_response(
                self._update(
                    rt,
                    namespace,
                    name,
                    body,
                    sub,
                    dry=bool(q.get("dryRun")),
                    strict=q.get("fieldValidation") == "Strict",
                )
            )
        if method == "PATCH":
            body = await self._body(request)
            return web.json_response(
                self._patch(rt, namespace, name, sub, request.content_type, body, q)
            )
        if method == "DELETE":
            body = await self._body(request) if request.can_read_body else None
            return web.json_response(
                self._delete(rt, namespace, name, body or {}, dry=bool(q.get("dryRun")))
            )
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

    # ------------------------------------------------------------------ reads

    def _get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.store.bucket(rt.store_key).get((namespace or "", name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{rt.qualified} "{name}" not found',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        return self._view(rt, obj)

    @staticmethod
    def _view(rt: ResourceType, obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = rt.group_version, rt.kind
        return out

    def _selected(self, rt: ResourceType, namespace: str | None, q: Any) -> list[Obj]:
        labels = kselect.label_selector(q.get("labelSelector"))
        fields = kselect.field_selector(q.get("fieldSelector"))
        out = []
        for (ns, _), obj in sorted(self.store.bucket(rt.store_key).items()):
            if namespace and ns != namespace:
                continue
            if labels(obj) and fields(obj):
                out.append(self._view(rt, obj))
        return out

    def _list(self, rt: ResourceType, namespace: str | None, q: Any) -> Obj:
        items = self._selected(rt, namespace, q)
        meta: Obj = {"resourceVersion": str(self.store.rv)}
        start = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.b64decode(q["continue"]))
                start = int(token["start"])
                meta["resourceVersion"] = token["rv"]
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "invalid continue token") from None
        limit = int(q.get("limit") or 0)
        if limit > 0 and start + limit < len(items):
            token = {"start": start + limit, "rv": meta["resourceVersion"]}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.group_version,
            "metadata": meta,
            "items": items,
        }

    def _table(self, rt: ResourceType, items: list[Obj], meta: Obj, q: Any) -> Obj:
        """A meta.k8s.io/v1 Table: Name, the CRD's printer columns (or Age), one row each."""
        columns = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "priority": 0,
                "description": "Name must be unique within a namespace.",
            }
        ]
        specs = rt.columns or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]
        for c in specs:
            columns.append(
                {
                    "name": c["name"],
                    "type": c.get("type", "string"),
                    "format": c.get("format", ""),
                    "priority": c.get("priority", 0),
                    "description": c.get("description", ""),
                }
            )
        rows = []
        include = q.get("includeObject", "Metadata")
        for obj in items:
            cells: list[Any] = [obj["metadata"]["name"]]
            for c in specs:
                value = kselect.jsonpath(obj, c["jsonPath"])
                if value is not None and c.get("type") == "date":
                    try:
                        born = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                        value = human_duration((datetime.now(UTC) - born).total_seconds())
                    except ValueError:
                        value = "<invalid>"
                cells.append(value)
            row: Obj = {"cells": cells}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                }
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "columnDefinitions": columns,
            "rows": rows,
        }

    # ------------------------------------------------------------------ writes

    def _check_body(self, rt: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        api_version = body.setdefault("apiVersion", rt.group_version)
        kind = body.setdefault("kind", rt.kind)
        if api_version != rt.group_version or kind != rt.kind:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({api_version}) and kind ({kind}) do "
                f"not match the expected {rt.group_version} {rt.kind}",
            )
        if not isinstance(body.setdefault("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        return body

    def _invalid(self, rt: ResourceType, name: str, errors: list[kschema.FieldError]) -> ApiError:
        return ApiError(
            422,
            "Invalid",
            kschema.render_invalid(rt.kind, rt.group, name, errors),
            {
                "name": name,
                "group": rt.group,
                "kind": rt.kind,
                "causes": [
                    {"reason": e.reason, "message": e.detail, "field": e.path} for e in errors
                ],
            },
        )

    def _admit(self, rt: ResourceType, obj: Obj, old: Obj | None, strict: bool) -> None:
        """What a real server does to a custom resource before storing it."""
        name = obj["metadata"].get("name", "")
        if rt.schema is not None:
            unknown = kschema.prune(rt.schema, obj)
            if unknown and strict:
                fields = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                    f"{rt.kind}: strict decoding error: {fields}",
                )
            kschema.apply_defaults(rt.schema, obj)
            errors = kschema.validate(rt.schema, obj, old)
            if errors:
                raise self._invalid(rt, name, errors)
        if rt.store_key == CRD_KEY:
            problems = check_crd(obj)
            if problems:
                raise ApiError(
                    422,
                    "Invalid",
                    f"CustomResourceDefinition.apiextensions.k8s.io "
                    f'"{name}" is invalid: ' + "; ".join(problems),
                )

    def _create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        dry: bool = False,
        strict: bool = False,
    ) -> Obj:
        obj = self._check_body(rt, copy.deepcopy(body))
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(
                secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5)
            )
            meta["name"] = meta["generateName"] + suffix
        name = meta.get("name")
        if not name:
            raise self._invalid(
                rt,
                "",
                [
                    kschema.FieldError(
                        "metadata.name",
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        if len(name) > 253 or not NAME_RE.match(name):
            raise self._invalid(
                rt,
                name,
                [
                    kschema.FieldError(
                        "metadata.name",
                        "FieldValueInvalid",
                        f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.', and must start and "
                        "end with an alphanumeric character",
                    )
                ],
            )
        if rt.namespaced:
            ns = meta.get("namespace") or namespace or "default"
            if namespace and ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does "
                    "not match the namespace sent on the request",
                )
            if ns not in {k[1] for k in self.store.bucket(NS_KEY)}:
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{ns}" not found',
                    {"name": ns, "kind": "namespaces"},
                )
            meta["namespace"] = ns
        else:
            ns = ""
            meta.pop("namespace", None)
        bucket = self.store.bucket(rt.store_key)
        if (ns, name) in bucket:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rt.qualified} "{name}" already exists',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        if rt.status:
            obj.pop("status", None)  # status is written through the subresource only
        for key in ("resourceVersion", "uid", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        self._admit(rt, obj, None, strict)
        if rt.store_key == CRD_KEY:
            obj["status"] = self._crd_status(obj)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        if dry:
            meta["resourceVersion"] = str(self.store.rv)
            return self._view(rt, obj)
        meta["resourceVersion"] = self.store.next_rv()
        bucket[(ns, name)] = obj
        self.store.record(rt.store_key, "ADDED", obj, None)
        if rt.store_key == CRD_KEY:
            self._sync_crd(obj, name)
        return self._view(rt, obj)

    @staticmethod
    def _crd_status(crd: Obj) -> Obj:
        t = now_rfc3339()
        return {
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": t,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": t,
                },
            ],
        }

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.store.bucket(rt.store_key).get((namespace or "", name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{rt.qualified} "{name}" not found',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        return obj

    def _conflict(self, rt: ResourceType, name: str) -> ApiError:
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object '
            "has been modified; please apply your changes to the latest version and "
            "try again",
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def _update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        sub: str | None,
        dry: bool = False,
        strict: bool = False,
    ) -> Obj:
        cur = self._stored(rt, namespace, name)
        new = self._check_body(rt, copy.deepcopy(body))
        meta = new["metadata"]
        if meta.get("name", name) != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta.get('name')}) does "
                f"not match the name on the URL ({name})",
            )
        if (
            meta.get("resourceVersion")
            and meta["resourceVersion"] != cur["metadata"]["resourceVersion"]
        ):
            raise self._conflict(rt, name)
        if sub == "status":
            status = new.get("status")
            new = copy.deepcopy(cur)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif rt.status:
            if "status" in cur:
                new["status"] = copy.deepcopy(cur["status"])
            else:
                new.pop("status", None)
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ):
            if key in cur["metadata"]:
                meta = new["metadata"]
                meta[key] = cur["metadata"][key]
            else:
                new["metadata"].pop(key, None)
        return self._commit(rt, cur, new, strict, dry)

    def _commit(self, rt: ResourceType, cur: Obj, new: Obj, strict: bool, dry: bool) -> Obj:
        meta = new["metadata"]
        if cur["metadata"].get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur["metadata"].get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{rt.kind} "{meta["name"]}" is invalid: '
                    "metadata.finalizers: Forbidden: no new finalizers can be added "
                    "if the object is being deleted",
                )
        self._admit(rt, new, cur, strict)
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if self._view(rt, new) == self._view(rt, cur):
            return self._view(rt, cur)  # a no-op write changes nothing, not even the version
        if self._spec_of(rt, new) != self._spec_of(rt, cur):
            meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        if dry:
            return self._view(rt, new)
        meta["resourceVersion"] = self.store.next_rv()
        key = (meta.get("namespace", ""), meta["name"])
        self.store.bucket(rt.store_key)[key] = new
        self.store.record(rt.store_key, "MODIFIED", new, cur)
        if rt.store_key == CRD_KEY:
            self._sync_crd(new, meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rt, new)
        return self._view(rt, new)

    @staticmethod
    def _spec_of(rt: ResourceType, obj: Obj) -> Obj:
        """Everything that counts for ``generation``: not metadata, not status if separate."""
        drop = {"metadata", "apiVersion", "kind"} | ({"status"} if rt.status else set())
        return {k: v for k, v in obj.items() if k not in drop}

    def _patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        sub: str | None,
        ctype: str,
        patch: Any,
        q: Any,
    ) -> Obj:
        strict = q.get("fieldValidation") == "Strict"
        dry = bool(q.get("dryRun"))
        bucket = self.store.bucket(rt.store_key)
        cur = bucket.get((namespace or "", name))
        if ctype == "application/apply-patch+yaml":
            if not q.get("fieldManager"):
                raise ApiError(400, "BadRequest", "PATCH apply requires a fieldManager")
            if cur is None:
                return self._create(rt, namespace, patch, dry=dry, strict=strict)
        if cur is None:
            self._stored(rt, namespace, name)  # raises the 404
        view = self._view(rt, cur)
        try:
            if ctype == "application/json-patch+json":
                patched = kpatch.json_patch(view, patch)
            elif ctype == "application/merge-patch+json":
                patched = kpatch.merge_patch(view, patch)
            elif ctype in (
                "application/strategic-merge-patch+json",
                "application/apply-patch+yaml",
            ):
                patched = kpatch.strategic_merge_patch(view, patch)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - "
                    f"accepted media types include: application/json-patch+json, "
                    f"application/merge-patch+json, "
                    f"application/apply-patch+yaml (got {ctype})",
                )
        except kpatch.PatchError as exc:
            code = 422 if exc.test_failed or "exist" in str(exc) else 400
            raise ApiError(code, "Invalid" if code == 422 else "BadRequest", str(exc)) from None
        if not isinstance(patched, dict):
            raise ApiError(400, "BadRequest", "the patch did not yield an object")
        # A resourceVersion carried by (or patched into) the result is a precondition.
        return self._update(rt, namespace, name, patched, sub, dry=dry, strict=strict)

    def _remove(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        bucket = self.store.bucket(rt.store_key)
        gone = bucket.pop(key, None)
        if gone is None:
            return
        gone = copy.deepcopy(gone)
        gone["metadata"]["resourceVersion"] = self.store.next_rv()
        self.store.record(rt.store_key, "DELETED", gone, None)
        if rt.store_key == NS_KEY:  # a namespace takes its objects with it
            for other in {t.store_key: t for t in self.types.values() if t.namespaced}.values():
                for (ns, _), child in list(self.store.bucket(other.store_key).items()):
                    if ns == meta["name"]:
                        self._remove(other, child)
        if rt.store_key == CRD_KEY:  # so does a CRD
            for t in [t for t in self.types.values() if t.crd == meta["name"]][:1]:
                for child in list(self.store.bucket(t.store_key).values()):
                    self._remove(t, child)
            self._sync_crd(None, meta["name"])

    def _delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: Obj, dry: bool = False
    ) -> Obj:
        cur = self._stored(rt, namespace, name)
        pre = options.get("preconditions") or {}
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]
        ):
            raise self._conflict(rt, name)
        if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
            raise self._conflict(rt, name)
        done: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": rt.group,
                "kind": rt.plural,
                "uid": cur["metadata"]["uid"],
            },
        }
        if dry:
            return done
        if cur["metadata"].get("finalizers"):
            if cur["metadata"].get("deletionTimestamp"):
                return self._view(rt, cur)
            new = copy.deepcopy(cur)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["generation"] = int(cur["metadata"].get("generation", 1)) + 1
            new["metadata"]["resourceVersion"] = self.store.next_rv()
            self.store.bucket(rt.store_key)[(namespace or "", name)] = new
            self.store.record(rt.store_key, "MODIFIED", new, cur)
            return self._view(rt, new)
        self._remove(rt, cur)
        return done

    def _delete_collection(self, rt: ResourceType, namespace: str | None, q: Any) -> Obj:
        items = self._selected(rt, namespace, q)
        for obj in items:
            self._delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], {})
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.group_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
        }

    # ------------------------------------------------------------------ watch

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None, as_table: bool
    ) -> web.StreamResponse:
        q = request.query
        labels = kselect.label_selector(q.get("labelSelector"))
        fields = kselect.field_selector(q.get("fieldSelector"))
        watcher = Watcher(rt.store_key, namespace, lambda o: labels(o) and fields(o))
        since = q.get("resourceVersion") or ""
        backlog: list[Obj] = []
        # Replay and registration happen without an await between them: no event is lost.
        if since in ("", "0") or q.get("sendInitialEvents") == "true":
            backlog = [{"type": "ADDED", "object": o} for o in self._selected(rt, namespace, q)]
            if q.get("sendInitialEvents") == "true":
                backlog.append(self._bookmark(rt, initial_end=True))
        else:
            try:
                from_rv = int(since)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from None
            if from_rv < self.store.compacted_rv:
                backlog = [
                    {
                        "type": "ERROR",
                        "object": ApiError(
                            410,
                            "Expired",
                            f"too old resource version: {from_rv} ({self.store.compacted_rv})",
                        ).status(),
                    }
                ]
            else:
                for ev in self.store.events:
                    seen = watcher.translate(ev) if ev.rv > from_rv else None
                    if seen:
                        backlog.append({"type": seen[0], "object": seen[1]})
        gone = bool(backlog) and backlog[-1]["type"] == "ERROR"
        if not gone:
            self.store.watchers.add(watcher)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            for item in backlog:
                await resp.write(self._frame(rt, item, as_table, q))
            if gone:
                return resp
            timeout = float(q.get("timeoutSeconds") or 1800)
            deadline = time.monotonic() + timeout
            bookmarks = q.get("allowWatchBookmarks") == "true"
            while (left := deadline - time.monotonic()) > 0:
                wait = min(left, self.bookmark_interval) if bookmarks else left
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and deadline - time.monotonic() > 0:
                        await resp.write(self._frame(rt, self._bookmark(rt), False, q))
                    continue
                if item is None:  # the emulator is stopping
                    break
                await resp.write(self._frame(rt, item, as_table, q))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(watcher)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await resp.write_eof()
        return resp

    def _bookmark(self, rt: ResourceType, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta},
        }

    def _frame(self, rt: ResourceType, item: Obj, as_table: bool, q: Any) -> bytes:
        if as_table and item["type"] in ("ADDED", "MODIFIED", "DELETED"):
            obj = self._view(rt, item["object"])
            item = {
                "type": item["type"],
                "object": self._table(
                    rt, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}, q
                ),
            }
        elif item["type"] != "ERROR":
            item = {
                "type": item["type"],
                "object": self._view(rt, item["object"])
                if item["type"] != "BOOKMARK"
                else item["object"],
            }
        return (json.dumps(item) + "\n").encode()
