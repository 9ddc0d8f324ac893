"""Smoke suite driven only by kubectl and a kubeconfig, so it runs against a real cluster.

Against a real cluster (the chart installed, operator and streaming nodes running):

    STREAMWAL_SMOKE_KUBECONFIG=~/.kube/config STREAMWAL_SMOKE_NAMESPACE=streamwal \\
        .venv/bin/pytest tests/operator/test_smoke.py

Without the variable it runs against the test control plane with the operator and one real node as
a fake pod (what CI does). The steps use nothing but kubectl either way.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operator.conftest import Cluster, Kubectl, pchannel_yaml, wait_for

REAL = os.environ.get("STREAMWAL_SMOKE_KUBECONFIG")


@pytest.fixture
def kctl(request, kube_bin: Path, tmp_path: Path) -> Iterator[Kubectl]:
    if REAL:
        home = tmp_path / "home"
        home.mkdir()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "KUBECONFIG": os.path.expanduser(REAL),
            "KUBECACHEDIR": str(home / "cache"),
        }
        ns = os.environ.get("STREAMWAL_SMOKE_NAMESPACE", "default")
        yield Kubectl(kube_bin / "kubectl", {**env, "STREAMWAL_NS": ns})
        shutil.rmtree(home, ignore_errors=True)
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    cluster.add_node(1)
    cluster.start_operator()
    yield cluster.kubectl


def status(kctl: Kubectl, ns: list[str], name: str) -> dict:
    out = kctl("get", "pch", name, *ns, "-o", "json", check=False)
    return json.loads(out.stdout).get("status", {}) if out.returncode == 0 else {}


def test_smoke_pchannel_lifecycle(kctl: Kubectl) -> None:
    ns = ["-n", kctl.env["STREAMWAL_NS"]] if "STREAMWAL_NS" in kctl.env else []
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    assert "pchannels" in kctl("api-resources", "--api-group=streamwal.io").stdout
    kctl("apply", *ns, "-f", "-", stdin=pchannel_yaml(name))
    try:

        def ready() -> dict:
            st = status(kctl, ns, name)
            conds = {c["type"]: c for c in st.get("conditions") or []}
            return st if conds.get("Ready", {}).get("status") == "True" else {}

        st = wait_for(ready, 90, f"{name} Ready")
        assert st["state"] == "Assigned" and st["term"] >= 1 and st["node"]["address"]
        row = kctl("get", "pch", name, *ns, "--no-headers").stdout.split()
        assert row[0] == name and row[2] == str(st["term"]) and row[3] == "Assigned", row
    finally:
        kctl("delete", "pch", name, *ns, "--wait=true", "--timeout=60s", check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and status(kctl, ns, name):
        time.sleep(0.5)
    assert "NotFound" in kctl("get", "pch", name, *ns, check=False).stderr
