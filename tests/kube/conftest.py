"""Fixtures for the Kubernetes tests: a namespace of the session's real control plane
(tests/control_plane.py), the PChannel CRD installed in it, and the real kubectl / helm.

helm is the static binary ``scripts/kube-tools`` puts in ``.venv/bin``; kubectl is the one
beside the API server (``$KUBEBUILDER_ASSETS/kubectl``, a link to the pinned
``.venv/bin/kubectl`` by default), never whatever is on the PATH. Every kubectl or helm run
gets its own kubeconfig, HOME and a fresh discovery cache, so no run sees state of another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.* imports
    sys.path.insert(0, str(ROOT))

from tests.control_plane import ControlPlane  # noqa: E402

BIN = ROOT / ".venv" / "bin"
CRD_FILE = ROOT / "crds" / "pchannels.streamwal.io.yaml"
CHART = ROOT / "helm" / "streamwal"


def wait_for(check: Callable[[], Any], timeout: float = 20, what: str = "") -> Any:
    """Poll `check` until it returns something truthy (every 0.1 s, bounded)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


@pytest.fixture(scope="session")
def kube_bin() -> Path:
    """The directory holding the pinned helm (and kubectl), installed on first use."""
    subprocess.run([str(ROOT / "scripts" / "kube-tools")], check=True, timeout=300)
    return BIN


def install_crd(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    """Create (or replace) a CRD and wait until it is Established and in the OpenAPI
    document: the real server publishes a new CRD's schema a moment after Established,
    and kubectl (explain, strict validation) reads it from there."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = cp.api()
    try:
        ext = client.ApiextensionsV1Api(api)
        name = manifest["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(manifest)
        except ApiException as err:
            if err.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            manifest = {**manifest, "metadata": {**manifest["metadata"],
                        "resourceVersion": current.metadata.resource_version}}  # fmt: skip
            ext.replace_custom_resource_definition(name, manifest)

        def established() -> bool:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            return conds.get("Established") == "True"

        wait_for(established, 30, f"CRD {name} Established")
        group = manifest["spec"]["group"]
        version = manifest["spec"]["versions"][0]["name"]
        path = f"/openapi/v3/apis/{group}/{version}"
        kind = manifest["spec"]["names"]["kind"]

        def published() -> bool:
            resp = api.call_api("GET", api.configuration.host + path)
            resp.read()
            return resp.status == 200 and f'"{kind}"'.encode() in resp.data

        wait_for(published, 30, f"{path} serving {kind}")
    finally:
        api.close()


@pytest.fixture(scope="session")
def pchannel_crd(kube_control_plane: ControlPlane) -> None:
    """The project's PChannel CRD, installed once per session."""
    install_crd(kube_control_plane, yaml.safe_load(CRD_FILE.read_text()))


@pytest.fixture
def kube_ns(kube_control_plane: ControlPlane) -> str:
    """A fresh namespace (with its `default` ServiceAccount) for one test."""
    return kube_control_plane.create_namespace()


@pytest.fixture
def kubeconfig(kube_control_plane: ControlPlane, kube_ns: str, tmp_path: Path) -> Path:
    """The admin's kubeconfig, its context set to the test's namespace."""
    return kube_control_plane.admin_kubeconfig(tmp_path / "admin.kubeconfig", kube_ns)


@dataclass
class Kubectl:
    """Runs the real kubectl (or helm, with `tool`) against the test's control plane."""

    binary: Path
    env: dict[str, str]

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        # A cold discovery cache each run: kubectl's disk cache would otherwise hide a CRD
        # registered since the previous run from short-name expansion (kubectl explain pch).
        shutil.rmtree(self.env["KUBECACHEDIR"], ignore_errors=True)
        proc = subprocess.run(
            [str(self.binary), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{self.binary.name} {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def tool(self, binary: Path) -> Kubectl:
        """The same environment (kubeconfig, HOME, caches) for another binary (helm)."""
        return Kubectl(binary, self.env)


def kubectl_for(cp: ControlPlane, config: Path, home: Path) -> Kubectl:
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "KUBECONFIG": str(config),
        "KUBECACHEDIR": str(home / "cache"),
    }
    binary = cp.assets / "kubectl"
    return Kubectl(binary if binary.exists() else BIN / "kubectl", env)


@pytest.fixture
def kubectl(
    kube_control_plane: ControlPlane, kube_bin: Path, kubeconfig: Path, tmp_path: Path
) -> Kubectl:
    return kubectl_for(kube_control_plane, kubeconfig, tmp_path / "kubectl-home")
