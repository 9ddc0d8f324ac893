"""The README's Kubernetes section (steps 1-5), run as written against the session's real
kube-apiserver with the real helm, kubectl and openssl.

The blocks are read from the README (between its `kubernetes:` markers), so the section
cannot drift from what works. Each shell block runs whole under `bash -e` in a fresh
directory (`helm/streamwal` linked in), namespace `streaming` as written. There is no
kubelet, so three things are adapted, each spelled out below and asserted to be there:
watches (`-w`) run as the plain `get` a watch starts with; the node pods the StatefulSet
would make are created by hand before step 4 deletes one; `helm test` (which waits for
its pod to run) is left out, and its hook is checked to exist instead.

Step 3's program runs as in a pod: it lists the Services through the API server and
dials the coord Service's cluster DNS name, which a private mount namespace's /etc/hosts
resolves (as cluster DNS would) to a real embedded coord listening on the Service's port;
the message it appends is then read back through that coord. Where user namespaces are
not allowed (no `unshare --map-root-user`), the other steps still run and the test ends
skipped, naming step 3.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamwal.client import connect
from streamwal.testing.local_cluster import LocalCluster
from tests.control_plane import ControlPlane
from tests.kube.conftest import CHART, kubectl_for
from tests.support import readme_blocks

NS = "streaming"
WATCH = re.compile(r"\s+-w(\s*&)?(?=\s*(#.*)?$)", re.MULTILINE)
NEEDS_KUBELET = "helm test wal -n streaming"


def _can_remap_hosts() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--map-root-user", "true"]
    return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0


def test_readme_kubernetes_steps(
    kube_control_plane: ControlPlane, kube_bin: Path, tmp_path: Path
) -> None:
    blocks = readme_blocks("kubernetes")
    assert [kind for kind, _ in blocks] == ["sh", "sh", "yaml", "python", "sh", "sh"], blocks
    install, pchannel, spec, program, failover, security = (body for _, body in blocks)
    cp = kube_control_plane
    work = tmp_path / "work"
    (work / "helm").mkdir(parents=True)
    (work / "helm" / "streamwal").symlink_to(CHART)
    env = kubectl_for(cp, cp.kubeconfig, tmp_path / "home").env
    env["PATH"] = f"{kube_bin}:{Path(sys.executable).parent}:/usr/bin:/bin"

    def sh(script: str) -> str:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work,
                              env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
        assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def unwatched(script: str) -> str:
        assert WATCH.search(script), script
        return WATCH.sub("", script)

    def kubectl_json(*args: str) -> dict:
        return json.loads(sh(" ".join(["kubectl", *args, "-n", NS, "-o", "json"])))

    # 1. Install: every object accepted; the coord Service is there for step 3.
    sh(unwatched(install))
    service = kubectl_json("get", "service", "wal-streamwal-coord")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]

    # 2. A PChannel, then the README's spec fragment on it: the CRD takes every field.
    out = sh(pchannel)
    header = out.split("\n", 2)[1].split()  # after `kubectl apply`'s line
    assert header[:1] == ["NAME"] and {"NODE", "TERM", "STATE", "REPLICAS", "READY"} <= set(
        header
    ), out
    assert "replicas" in out and "retention" in out  # kubectl explain pch.spec
    manifest = {"apiVersion": "streamwal.io/v1alpha1", "kind": "PChannel",
                "metadata": {"name": "orders"}, **yaml.safe_load(spec)}  # fmt: skip
    sh(f"kubectl apply -n {NS} -f - <<'YAML'\n{yaml.safe_dump(manifest)}YAML")
    stored = kubectl_json("get", "pch", "orders")["spec"]
    assert stored["retention"] == {"age": "7d", "size": "10GB"}, stored
    wanted = {"nodeSelector": {"disk": "ssd"}, "antiAffinity": "Required"}
    assert wanted.items() <= stored["placement"].items(), stored  # and the CRD's defaults
    assert stored["failover"]["allowDataLoss"] is False

    # 3. The program, as in a pod (below); without unshare the rest still runs.
    pod_dns = _can_remap_hosts()
    if pod_dns:
        _run_as_in_a_pod(program, port, env, work, tmp_path)

    # 4. The node pods the StatefulSet would make from its template (no controller runs
    # here), then step 4.
    template = kubectl_json("get", "statefulset", "wal-streamwal-node")["spec"]["template"]
    pods = []
    for i in range(3):
        name = f"wal-streamwal-node-{i}"
        claim = {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{name}"}}
        pod_spec = {**template["spec"], "volumes": [*template["spec"]["volumes"], claim]}
        pods.append({"apiVersion": "v1", "kind": "Pod", "spec": pod_spec,
                     "metadata": {**template["metadata"], "name": name}})  # fmt: skip
    listing = {"apiVersion": "v1", "kind": "List", "items": pods}
    sh(f"kubectl apply -n {NS} -f - <<'YAML'\n{yaml.safe_dump(listing)}YAML")
    sh(unwatched(failover))
    left = {p["metadata"]["name"] for p in kubectl_json("get", "pods")["items"]}
    assert left == {"wal-streamwal-node-0", "wal-streamwal-node-2"}  # node 1 deleted

    # 5. A certificate of the chart's CA and a role for it; `helm test` needs a kubelet.
    assert security.count(NEEDS_KUBELET) == 1
    sh("\n".join(line for line in security.splitlines() if NEEDS_KUBELET not in line))
    sh("openssl verify -CAfile ca.crt app.crt")
    access = kubectl_json("get", "configmap", "wal-streamwal-access")["data"]
    assert "orders-app" in "".join(access.values()), access
    hooks = sh(f"helm get hooks wal -n {NS}")
    assert "helm.sh/hook: test" in hooks
    if not pod_dns:
        pytest.skip("steps 1, 2, 4, 5 passed; step 3 needs unshare --mount --map-root-user")


def _run_as_in_a_pod(program: str, port: int, env: dict[str, str], work: Path, tmp: Path) -> None:
    """Step 3's program, the coord found through the API server and dialled by name."""
    host = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.1"
    cluster = LocalCluster(tmp / "cluster", nodes=1, log_level="warning",
                           coord_address=f"{host}:{port}")  # fmt: skip
    asyncio.run(cluster.start())
    try:
        create = ["streamwal", "channel", "create", "orders", "--coord", cluster.coord_address]
        subprocess.run(create, env=env, check=True, capture_output=True, timeout=60)
        hosts = tmp / "hosts"
        hosts.write_text(f"{host} wal-streamwal-coord.{NS}.svc\n")
        pod = f'mount --bind {hosts} /etc/hosts && exec {sys.executable} -c "$PROGRAM"'
        done = subprocess.run(
            ["unshare", "--mount", "--map-root-user", "sh", "-c", pod],
            env={**env, "PROGRAM": program}, cwd=work, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        with connect(coord=cluster.coord_address) as wal:
            end = wal.end_offset("orders")
            got = [(m.vchannel, m.payload) for m in wal.consumer("orders", end_offset=end,
                                                                  timeout=10)]  # fmt: skip
        assert got == [("orders_v1", b"hello")]
    finally:
        asyncio.run(cluster.close())
