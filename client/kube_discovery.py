"""`connect(namespace=...)`: find a streamwal installation's coord through Kubernetes.

The Helm chart publishes the coord's gRPC port (AssignmentDiscover, broadcast) as a
Service labelled `app.kubernetes.io/component: coord` with a port named `grpc`; the
accessor needs the coord (routing follows its pushes, broadcasts go through it), so the
namespace is resolved to that Service's cluster DNS name. Choosing the Service is pure
code (`coord_address_from_services`); listing them is the adapter around it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from streamwal.errors import InvalidArgument, Unavailable

COORD_SELECTOR = "app.kubernetes.io/component=coord"
CALL_TIMEOUT_S = 5.0


def coord_address_from_services(
    services: Iterable[dict], namespace: str, name: str | None = None
) -> str:
    """HOST:PORT of the one coord Service (or of the one called `name`)."""
    candidates = [s for s in services if name is None or s["metadata"]["name"] == name]
    if not candidates:
        wanted = f"Service {name!r}" if name else f"a Service labelled {COORD_SELECTOR}"
        raise Unavailable(f"namespace {namespace!r} has no {wanted}: is streamwal installed?")
    if len(candidates) > 1:
        names = sorted(s["metadata"]["name"] for s in candidates)
        raise InvalidArgument(
            f"namespace {namespace!r} has several coord Services {names}: pick one with service="
        )
    svc = candidates[0]
    ports = [p for p in svc.get("spec", {}).get("ports", []) if p.get("name") == "grpc"]
    if not ports:
        raise InvalidArgument(f"Service {svc['metadata']['name']!r} has no port named 'grpc'")
    return f"{svc['metadata']['name']}.{namespace}.svc:{ports[0]['port']}"


def kube_api_client(kubeconfig: str | None = None) -> Any:
    """A Kubernetes ApiClient: in-cluster when running in a pod (and no kubeconfig is
    given), else from the kubeconfig file (default: ~/.kube/config, $KUBECONFIG)."""
    from kubernetes import client, config  # an optional dependency: only this needs it

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)


def coord_address_in_namespace(
    namespace: str, *, kubeconfig: str | None = None, service: str | None = None
) -> str:
    """The coord of the streamwal installation in `namespace` (blocking: one list call)."""
    from kubernetes import client

    api = kube_api_client(kubeconfig)
    try:
        listing = client.CoreV1Api(api).list_namespaced_service(
            namespace, label_selector=COORD_SELECTOR, _request_timeout=CALL_TIMEOUT_S
        )
        services = [api.sanitize_for_serialization(s) for s in listing.items]
    except Exception as exc:  # the API server: one typed error for callers
        raise Unavailable(f"listing Services in namespace {namespace!r} failed: {exc}") from exc
    finally:
        api.close()
    return coord_address_from_services(services, namespace, service)
