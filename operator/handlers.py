"""Kopf handlers of `streamwal operator`: thin forwards to OperatorRuntime, and Kopf's settings.

Kopf only watches: PChannels (every event refreshes the runtime's view) and the
streaming-node pods (the node set). It adds no finalizer (no handler needs one), so
deleting a PChannel, or a namespace, never waits for an operator: the deleted channel
leaves the coord's view and the nodes serving it are fenced at their next probe. Kopf
removes the finalizer older versions of the operator added. Its bookkeeping, if any, goes
to annotations with prefix ``streamwal.io``; ``status`` is the operator's meta.

Cluster scanning is off: Kopf watches the one namespace it is given and finds the
resources by API discovery, so it needs neither to list namespaces nor to watch CRDs
(neither is granted by the chart's Role).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from streamwal.operator.kube_meta_store import GROUP, PLURAL, VERSION
from streamwal.operator.runtime import OperatorRuntime

FINALIZER = "streamwal.io/release"


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` -> {k: v, k2: v2} (equality selectors, what Kopf filters with)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad label selector {part!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def settings() -> kopf.OperatorSettings:
    out = kopf.OperatorSettings()
    out.scanning.disabled = True
    out.persistence.finalizer = FINALIZER
    out.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="streamwal.io")
    out.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="streamwal.io", key="last-handled-configuration"
    )
    out.posting.level = logging.WARNING
    out.watching.server_timeout = 60
    out.watching.client_timeout = 90
    return out


def build_registry(
    runtime: OperatorRuntime, loop: asyncio.AbstractEventLoop
) -> kopf.OperatorRegistry:
    """Handlers that pass events to `runtime`, which lives in `loop` (Kopf runs in its own
    thread and loop)."""
    registry = kopf.OperatorRegistry()
    labels = parse_selector(runtime.cfg.node_selector)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of Kopf's default login handlers: in-cluster or kubeconfig.
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def pchannel_event(name: str, body: kopf.Body, **_: Any) -> None:
        done = asyncio.run_coroutine_threadsafe(runtime.pchannel_event(name, dict(body)), loop)
        await asyncio.wrap_future(done)

    @kopf.on.event("", "v1", "pods", labels=labels, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        loop.call_soon_threadsafe(runtime.pod_event, type, dict(body))

    return registry
