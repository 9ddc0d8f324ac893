"""connect(namespace=...): the coord Service of a streamwal installation, found through the
Kubernetes API (the real kube-apiserver of the test session, real kubernetes client)."""

from __future__ import annotations

import pytest
from kubernetes import client

from streamwal.client.aio import connect
from streamwal.client.kube_discovery import (
    coord_address_from_services,
    coord_address_in_namespace,
    kube_api_client,
)
from streamwal.errors import InvalidArgument, Unavailable
from tests.kube.conftest import kube_ns, kubeconfig  # noqa: F401  (fixtures)


def service(name: str, port: int = 19500, port_name: str = "grpc") -> dict:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "coord"}},
        "spec": {"ports": [{"name": "metrics", "port": 9090}, {"name": port_name, "port": port}]},
    }


def test_the_one_coord_service_gives_the_address() -> None:
    assert coord_address_from_services([service("sw-coord")], "prod") == "sw-coord.prod.svc:19500"
    two = [service("a-coord", 1), service("b-coord", 2)]
    with pytest.raises(InvalidArgument, match="several coord Services"):
        coord_address_from_services(two, "prod")
    assert coord_address_from_services(two, "prod", "b-coord") == "b-coord.prod.svc:2"
    with pytest.raises(Unavailable, match="is streamwal installed"):
        coord_address_from_services([], "prod")
    with pytest.raises(InvalidArgument, match="no port named 'grpc'"):
        coord_address_from_services([service("x", port_name="http")], "prod")


async def test_connect_by_namespace_finds_the_coord_service(
    kubeconfig,  # noqa: F811
    kube_ns,  # noqa: F811
    kube_control_plane,
) -> None:
    api = kube_api_client(str(kubeconfig))
    try:
        core = client.CoreV1Api(api)
        core.create_namespaced_service(kube_ns, service("streamwal-coord"))
        other = service("web")
        other["metadata"]["labels"] = {"app.kubernetes.io/component": "web"}
        core.create_namespaced_service(kube_ns, other)
    finally:
        api.close()
    address = coord_address_in_namespace(kube_ns, kubeconfig=str(kubeconfig))
    assert address == f"streamwal-coord.{kube_ns}.svc:19500"
    # Outside the cluster (here) the Service's DNS name does not resolve: said at once.
    forward = r"does not resolve here.*port-forward svc/streamwal-coord"
    with pytest.raises(Unavailable, match=forward):
        await connect(namespace=kube_ns, kubeconfig=str(kubeconfig))
    empty = kube_control_plane.create_namespace()
    with pytest.raises(Unavailable, match="is streamwal installed"):
        await connect(namespace=empty, kubeconfig=str(kubeconfig))
    with pytest.raises(InvalidArgument, match="either coord"):
        await connect(coord="127.0.0.1:1", namespace="sw")
