"""Kubernetes discovery with a kubeconfig that carries its credentials inline (CA, client
certificate and key, as kubeadm and cloud providers write them) leaves no file behind,
even in a process that ends as Spark's Python workers do (os._exit, no atexit).

Against the real kube-apiserver (its admin client certificate: mutual TLS)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.control_plane import ControlPlane
from tests.kube.conftest import pchannel_crd  # noqa: F401  (fixture)
from tests.spark.helpers import assign
from tests.spark.test_kube_failover import kube  # noqa: F401  (fixture)

PROGRAM = """
import json, os, sys
from streamwal.spark.discovery import locate
from streamwal.spark.options import DiscoveryConfig
cfg = DiscoveryConfig(kube_namespace=sys.argv[2], kubeconfig=sys.argv[1], timeout_s=20)
for _ in range(3):  # a query plans with several discoveries
    owners, _ = locate(cfg, lambda p: True, ["kc-0"])
print(json.dumps({p: [o.address, o.term] for p, o in owners.items()}), flush=True)
os._exit(0)  # how Spark's Python workers end: atexit clean-up never runs
"""


def inline_kubeconfig(path: Path, cp: ControlPlane, namespace: str) -> Path:
    """The admin's kubeconfig with every credential inline (*-data), none by path."""
    assert cp.ca is not None and cp.admin is not None

    def data(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {
            "server": cp.server, "certificate-authority-data": data(cp.ca.cert)}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": data(cp.admin.cert),
            "client-key-data": data(cp.admin.key)}}],
        "contexts": [{"name": "test", "context": {
            "cluster": "test", "user": "admin", "namespace": namespace}}],
    }))  # fmt: skip
    return path


def test_inline_credentials_leave_no_file_in_a_worker_that_exits_hard(
    kube,  # noqa: F811
    kube_control_plane: ControlPlane,
    start_node,
    tmp_path: Path,
):
    node = start_node("n1")
    assign(node.address, 1, "kc-0")
    kube.pchannel("kc-0", "Assigned", 1, 1, node.address)
    kubeconfig = inline_kubeconfig(tmp_path / "kubeconfig", kube_control_plane, kube.ns)
    private_tmp = tmp_path / "worker-tmp"
    private_tmp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(kubeconfig), kube.ns],
        env={**os.environ, "TMPDIR": str(private_tmp)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"kc-0": [node.address, 1]}
    assert sorted(p.name for p in private_tmp.rglob("*")) == []  # no PEM file, no key left
