"""The real ``kopf run`` against the emulator: handlers, status patches, its finalizer
(JSON patch guarded by a resourceVersion ``test``), Events. The operator of issue 6 is
built on exactly these mechanics, so the emulator must carry them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.kube.conftest import CRD_FILE
from tests.kube.emulator import KubeEmulator

OPERATOR = """
import kopf

@kopf.on.create("streamwal.io", "v1alpha1", "pchannels")
def created(body, patch, **_):
    patch.status["state"] = "Assigned"
    patch.status["term"] = 1
    kopf.info(body, reason="Assigned", message="assigned under term 1")

@kopf.on.delete("streamwal.io", "v1alpha1", "pchannels")
def deleted(name, logger, **_):
    logger.info(f"released {name}")
"""
G, V, P, NS = "streamwal.io", "v1alpha1", "pchannels", "default"


def wait_for(check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {check}")


def test_kopf_operator_runs_against_the_emulator(
    emulator: KubeEmulator, kubeconfig: Path, tmp_path: Path
) -> None:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    client.ApiextensionsV1Api(api).create_custom_resource_definition(
        yaml.safe_load(CRD_FILE.read_text())
    )
    (tmp_path / "op.py").write_text(OPERATOR)
    log = tmp_path / "kopf.log"
    kopf = Path(sys.executable).parent / "kopf"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(kopf), "run", "--standalone", "-n", NS, str(tmp_path / "op.py")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
        )
    try:
        co = client.CustomObjectsApi(api)
        co.create_namespaced_custom_object(
            G,
            V,
            NS,
            P,
            {"apiVersion": f"{G}/{V}", "kind": "PChannel", "metadata": {"name": "ch-0"}},
        )

        def assigned() -> dict[str, Any] | None:
            obj = co.get_namespaced_custom_object(G, V, NS, P, "ch-0")
            return obj if obj.get("status", {}).get("state") == "Assigned" else None

        obj = wait_for(assigned)
        assert obj["status"]["term"] == 1
        assert obj["metadata"]["finalizers"]  # Kopf's, added before the handler ran
        co.delete_namespaced_custom_object(G, V, NS, P, "ch-0")

        def gone() -> bool:
            try:
                co.get_namespaced_custom_object(G, V, NS, P, "ch-0")
            except ApiException as err:
                return err.status == 404
            return False

        wait_for(gone)
        events = wait_for(lambda: client.CoreV1Api(api).list_namespaced_event(NS).items)
        assert any(e.involved_object.name == "ch-0" and e.reason == "Assigned" for e in events), [
            (e.involved_object.name, e.reason) for e in events
        ]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        api.close()
    text = log.read_text()
    assert "released ch-0" in text, text
    assert "Traceback" not in text, text
