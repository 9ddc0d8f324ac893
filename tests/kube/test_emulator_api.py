"""The API contract an operator relies on, checked with the real ``kubernetes`` client.

Optimistic concurrency (409 on a stale resourceVersion), generation vs status, watch
resume and 410 Gone, selectors, finalizers: if the emulator got any of these wrong, the
operator tests built on it would prove nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.kube.conftest import CRD_FILE
from tests.kube.emulator import KubeEmulator

GROUP, VERSION, PLURAL, NS = "streamwal.io", "v1alpha1", "pchannels", "default"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def api(emulator: KubeEmulator, kubeconfig: Path) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    crd = yaml.safe_load(CRD_FILE.read_text())
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(crd)
    yield api_client
    api_client.close()


def _pch(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PChannel",
        "metadata": {"name": name},
        "spec": {"replicas": replicas},
    }


def _create(co: client.CustomObjectsApi, name: str, replicas: int = 1) -> dict[str, Any]:
    return co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _pch(name, replicas))


def test_stale_resource_version_write_gets_409(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    first = _create(co, "ch-0")
    fresh = co.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "ch-0", {"status": {"term": 1, "state": "Assigned"}}
    )
    assert int(fresh["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    # A writer still holding the first version must not overwrite the term.
    stale = dict(first, status={"term": 0, "state": "Pending"})
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "ch-0", stale)
    assert err.value.status == 409
    assert "the object has been modified" in json.loads(err.value.body)["message"]
    # Same through a merge patch that carries the version as a precondition.
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            NS,
            PLURAL,
            "ch-0",
            {
                "metadata": {"resourceVersion": first["metadata"]["resourceVersion"]},
                "status": {"term": 0},
            },
        )
    assert err.value.status == 409
    now = co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-0")
    assert now["status"]["term"] == 1


def test_generation_counts_spec_changes_and_status_is_separate(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    _create(co, "ch-0")
    # A main-resource write cannot set status; a status write cannot change spec.
    body = co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        "ch-0",
        {"status": {"term": 9}, "metadata": {"labels": {"team": "a"}}},
    )
    assert "status" not in body and body["metadata"]["generation"] == 1
    body = co.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "ch-0", {"spec": {"replicas": 5}, "status": {"term": 2}}
    )
    assert body["spec"]["replicas"] == 1 and body["status"]["term"] == 2
    assert body["metadata"]["generation"] == 1
    body = co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "ch-0", {"spec": {"replicas": 3}}
    )
    assert body["metadata"]["generation"] == 2 and body["status"]["term"] == 2
    # A write that changes nothing does not bump the version (no watch event either).
    again = co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "ch-0", {"spec": {"replicas": 3}}
    )
    assert again["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
    # The status is validated against the schema too.
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "ch-0", {"status": {"term": -1}}
        )
    assert err.value.status == 422 and "status.term" in err.value.body


def test_list_has_kind_and_resource_version(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    _create(co, "ch-0")
    _create(co, "ch-1")
    listed = co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=1)
    assert listed["kind"] == "PChannelList" and len(listed["items"]) == 1
    assert int(listed["metadata"]["resourceVersion"]) > 0
    rest = co.list_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, _continue=listed["metadata"]["continue"]
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["ch-1"]
    pods = client.CoreV1Api(api).list_namespaced_pod(NS)
    assert pods.kind == "PodList" and pods.metadata.resource_version


def _events(co: client.CustomObjectsApi, **kw: Any) -> list[tuple[str, str, int]]:
    out = []
    for ev in watch.Watch().stream(
        co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, timeout_seconds=1, **kw
    ):
        out.append(
            (
                ev["type"],
                ev["object"]["metadata"]["name"],
                ev["object"].get("status", {}).get("term", 0),
            )
        )
    return out


def test_watch_resumes_from_a_resource_version(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    created = _create(co, "ch-0")
    since = created["metadata"]["resourceVersion"]
    for term in (1, 2):
        co.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "ch-0", {"status": {"term": term}}
        )
    co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-0")
    started = time.monotonic()
    assert _events(co, resource_version=since) == [
        ("MODIFIED", "ch-0", 1),
        ("MODIFIED", "ch-0", 2),
        ("DELETED", "ch-0", 2),
    ]
    assert time.monotonic() - started < 5  # timeoutSeconds ended the stream


def test_watch_streams_live_events(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    seen: list[str] = []

    def watcher() -> None:
        for ev in watch.Watch().stream(
            co.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, timeout_seconds=3
        ):
            seen.append(f"{ev['type']} {ev['object']['metadata']['name']}")
            if len(seen) == 2:
                return

    t = threading.Thread(target=watcher)
    t.start()
    time.sleep(0.5)
    _create(co, "ch-live")
    co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-live")
    t.join(5)
    assert seen == ["ADDED ch-live", "DELETED ch-live"]


def test_watch_from_a_compacted_version_is_410_gone(
    api: client.ApiClient, emulator: KubeEmulator
) -> None:
    co = client.CustomObjectsApi(api)
    old = _create(co, "ch-0")["metadata"]["resourceVersion"]
    co.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "ch-0", {"status": {"term": 1}}
    )
    emulator.compact()
    with pytest.raises(ApiException) as err:
        _events(co, resource_version=old)
    assert err.value.status == 410
    # A fresh list gives a version to watch from again.
    rv = co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["metadata"]
    assert _events(co, resource_version=rv["resourceVersion"]) == []


def test_label_and_field_selectors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for i, component in enumerate(("streaming-node", "streaming-node", "operator")):
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": f"p{i}", "labels": {"app.kubernetes.io/component": component}},
                "spec": {"containers": [{"name": "c", "image": "streamwal"}]},
            },
        )
    names = [
        p.metadata.name
        for p in core.list_namespaced_pod(
            NS, label_selector="app.kubernetes.io/component=streaming-node"
        ).items
    ]
    assert names == ["p0", "p1"]
    names = [
        p.metadata.name
        for p in core.list_namespaced_pod(
            NS, label_selector="app.kubernetes.io/component notin (streaming-node)"
        ).items
    ]
    assert names == ["p2"]
    names = [
        p.metadata.name
        for p in core.list_namespaced_pod(NS, field_selector="metadata.name!=p0").items
    ]
    assert names == ["p1", "p2"]


def test_finalizers_hold_deletion_until_removed(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    body = _pch("ch-0")
    body["metadata"]["finalizers"] = ["streamwal.io/release"]
    co.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-0")
    held = co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-0")
    assert held["metadata"]["deletionTimestamp"]
    # Kopf removes its finalizer with a JSON patch guarded by a resourceVersion test op.
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "ch-0", stale, _content_type=JSON_PATCH
        )
    assert err.value.status == 422
    ops = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": held["metadata"]["resourceVersion"],
        },
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "ch-0", ops, _content_type=JSON_PATCH
    )
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ch-0")
    assert err.value.status == 404


def test_namespaces_must_exist_and_take_their_objects(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    co = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(GROUP, VERSION, "nowhere", PLURAL, _pch("ch-0"))
    assert err.value.status == 404
    core.create_namespace({"metadata": {"name": "team-a"}})
    co.create_namespaced_custom_object(GROUP, VERSION, "team-a", PLURAL, _pch("ch-0"))
    core.delete_namespace("team-a")
    assert co.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"] == []
