"""Streaming nodes from pods: id, gRPC address, readiness, whether it is being deleted
(drained), its labels and topology domain. Pure functions over pod dicts.

A pod is a usable node when it has an IP, a container port named ``grpc``, a node id, and
its ``Ready`` condition is True (its gRPC health probe passes). The node id is the
StatefulSet ordinal (label ``apps.kubernetes.io/pod-index``, what the chart passes to the
node as ``--node-id``); pods without it fall back to the ``streamwal.io/node-id`` label
or the ordinal at the end of the pod name.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("streamwal.operator.pods")

ID_LABELS = ("apps.kubernetes.io/pod-index", "streamwal.io/node-id")
_ORDINAL = re.compile(r"-(\d+)$")
Pod = dict[str, Any]


def node_id(pod: Pod) -> int | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key in ID_LABELS:
        value = str(labels.get(key, ""))
        if value.isdigit():
            return int(value)
    found = _ORDINAL.search(meta.get("name", ""))
    return int(found.group(1)) if found else None


def grpc_port(pod: Pod) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "grpc" and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def is_ready(pod: Pod) -> bool:
    """Its Ready condition is True. A terminating pod stays a node while it is Ready (its
    container still serves): it is drained (`draining`) so that it hands over what it
    leads before the kubelet stops it; it leaves once NotReady or deleted."""
    status = pod.get("status") or {}
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def address(pod: Pod) -> str | None:
    ip, port = (pod.get("status") or {}).get("podIP"), grpc_port(pod)
    if not ip or not port:
        return None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def placement_attrs(pods: list[Pod]) -> tuple[dict[int, dict[str, str]], dict[int, str]]:
    """({node id: pod labels}, {node id: topology domain}) of the pods that are nodes. The
    domain is the Kubernetes node a pod runs on (`spec.nodeName`: the
    kubernetes.io/hostname topology), or the pod itself while it has none."""
    nodes = nodes_from_pods(pods)
    labels: dict[int, dict[str, str]] = {}
    domains: dict[int, str] = {}
    for pod in pods:
        nid = node_id(pod)
        if nid in nodes and nid not in labels:
            meta = pod.get("metadata") or {}
            labels[nid] = dict(meta.get("labels") or {})
            domains[nid] = (pod.get("spec") or {}).get("nodeName") or f"pod {meta.get('name')}"
    return labels, domains


def draining(pods: list[Pod]) -> set[int]:
    """Node ids of the pods being deleted (deletionTimestamp set) that are still nodes."""
    nodes = nodes_from_pods(pods)
    return {
        nid
        for pod in pods
        if (pod.get("metadata") or {}).get("deletionTimestamp")
        and (nid := node_id(pod)) in nodes
        and address(pod) == nodes[nid]
    }


def nodes_from_pods(pods: list[Pod]) -> dict[int, str]:
    """{node id: address} of the Ready pods; on a duplicate id the first pod by name wins."""
    out: dict[int, str] = {}
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        nid, addr = node_id(pod), address(pod)
        if nid is None or addr is None or not is_ready(pod):
            continue
        if nid in out:
            log.warning("two pods claim one node id", extra={"node": nid, "address": addr})
            continue
        out[nid] = addr
    return out
