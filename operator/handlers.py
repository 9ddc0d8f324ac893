"""Kopf handlers of `streamwal operator`: thin forwards to OperatorRuntime.

Registered into a registry built from the command line (the pod label selector is a flag).
Kopf keeps its own bookkeeping in annotations (prefix ``streamwal.io``) and never in
``status``: the PChannel status schema is the operator's meta and prunes anything else.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from streamwal.errors import StreamingError
from streamwal.operator.kube_meta_store import GROUP, PLURAL, VERSION
from streamwal.operator.runtime import OperatorConfig, OperatorRuntime

log = logging.getLogger("streamwal.operator")
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


def build_registry(cfg: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    holder: dict[str, OperatorRuntime] = {}
    labels = parse_selector(cfg.node_selector)

    def runtime() -> OperatorRuntime:
        return holder["runtime"]

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of Kopf's default login handlers: in-cluster or kubeconfig.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="streamwal.io"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="streamwal.io", key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        holder["runtime"] = OperatorRuntime(cfg)
        await holder["runtime"].start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if "runtime" in holder:
            await holder["runtime"].stop()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def pchannel_event(name: str, body: kopf.Body, **_: Any) -> None:
        rt = runtime()
        rt.touch()
        generation = body.get("metadata", {}).get("generation")
        observed = (body.get("status") or {}).get("observedGeneration")
        if generation and observed is not None and generation != observed:
            try:
                await rt.heal(name, refresh=True)  # spec changed: say we saw it, now
            except StreamingError as err:
                log.warning("heal failed", extra={"pchannel": name, "error": str(err)})
        rt.request_refresh()

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=2.0)
    async def pchannel_daemon(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
        """Keeps the activity gate open and heals status every resync period."""
        rt = runtime()
        next_heal = 0.0
        loop_time = 0.0
        while not stopped:
            rt.touch()
            if loop_time >= next_heal:
                try:
                    await rt.heal(name)
                except StreamingError as err:
                    log.warning("heal failed", extra={"pchannel": name, "error": str(err)})
                next_heal = loop_time + cfg.resync
            await stopped.wait(1.0)
            loop_time += 1.0

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def pchannel_deleted(name: str, **_: Any) -> None:
        rt = runtime()
        rt.touch()
        try:
            await rt.release(name)
        except StreamingError as err:
            raise kopf.TemporaryError(f"release of {name} failed: {err}", delay=1.0) from err

    @kopf.on.event("", "v1", "pods", labels=labels, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        runtime().touch()
        runtime().pod_event(type, dict(body))

    return registry
