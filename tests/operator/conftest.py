"""A small Kubernetes "cluster" for operator tests: a namespace of the session's real
kube-apiserver, the real kubectl, the operator CLI in a subprocess, and real streaming
nodes posing as pods.

The operator runs as the chart runs it: under the chart's own ServiceAccount (a token
from the TokenRequest API) with exactly the chart's Role, and with a Lease; any
"forbidden" in its log fails the test. Each fake pod gets its own loopback address
(127.0.0.2, 127.0.0.3, ...) with a real streaming node listening there; its Pod object
carries that IP, the node-selector labels, the StatefulSet ordinal label and a container
port named ``grpc``; readiness is written through ``pods/status`` as a kubelet would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from streamwal import transport  # noqa: E402
from streamwal.proto import streaming_pb2 as pb  # noqa: E402
from streamwal.proto import streaming_pb2_grpc as pbg  # noqa: E402
from streamwal.proto import wire_pb2  # noqa: E402
from streamwal.testing.local_node import LocalNode  # noqa: E402
from tests.control_plane import ControlPlane  # noqa: E402
from tests.kube import conftest as kube  # noqa: E402
from tests.kube.conftest import CHART, Kubectl, wait_for  # noqa: E402

# The control-plane / kubectl fixtures of tests/kube, shared with this folder.
kube_bin, kube_ns, kubeconfig, kubectl, pchannel_crd = (
    kube.kube_bin,
    kube.kube_ns,
    kube.kubeconfig,
    kube.kubectl,
    kube.pchannel_crd,
)

G, V, P = "streamwal.io", "v1alpha1", "pchannels"
RELEASE = "sw"
OPERATOR_ACCOUNT = f"{RELEASE}-streamwal-operator"
LEASE = OPERATOR_ACCOUNT
NODE_LABELS = {
    "app.kubernetes.io/component": "streaming-node",
    "app.kubernetes.io/name": "streamwal",
}
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
FORBIDDEN = re.compile("forbidden", re.IGNORECASE)


def pchannel_yaml(*names: str, **spec: Any) -> str:
    docs = [
        {"apiVersion": f"{G}/{V}", "kind": "PChannel", "metadata": {"name": n}, "spec": spec}
        for n in names
    ]
    return yaml.safe_dump_all(docs)


def log_time(text: str, msg: str) -> float | None:
    """Wall-clock time of the first JSON log line whose msg is `msg`."""
    for line in text.splitlines():
        if f'"msg": "{msg}"' in line:
            ts = json.loads(line)["ts"]
            stamp = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            return stamp.timestamp()
    return None


def collect_status(address: str, timeout: float = 2.0) -> dict[str, int]:
    """{pchannel: term} a node serves, from its CollectStatus (on the internal listener,
    whose port the node's Describe names)."""
    with grpc.insecure_channel(address) as ch:
        describe = ch.unary_unary(
            transport.DESCRIBE,
            request_serializer=wire_pb2.DescribeNodeRequest.SerializeToString,
            response_deserializer=wire_pb2.DescribeNodeResponse.FromString,
        )
        port = describe(wire_pb2.DescribeNodeRequest(), timeout=timeout).internal_port
    with grpc.insecure_channel(f"{address.rpartition(':')[0]}:{port}" if port else address) as ch:
        stub = pbg.StreamingNodeManagerServiceStub(ch)
        resp = stub.CollectStatus(pb.StreamingNodeManagerCollectStatusRequest(), timeout=timeout)
    return {c.pchannel.name: c.pchannel.term for c in resp.channels}


def chart_rbac(kube_bin: Path, namespace: str, *sets: str) -> str:
    """The chart's ServiceAccounts and RBAC objects, rendered for `namespace`."""
    rendered = subprocess.run(
        [str(kube_bin / "helm"), "template", RELEASE, str(CHART), "--namespace", namespace,
         *sets],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
    return yaml.safe_dump_all(docs)


class OperatorProcess:
    """`streamwal operator` as a child process with its own log file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        lease: str | None,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "streamwal",
            "operator",
            *(["--lease", lease] if lease else []),
            "--namespace",
            namespace,
            "--coord-listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--probe-interval",
            "0.3",
            "--grace",
            "1.0",
            "--resync",
            "2",
            *extra,
        ]
        env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started = wait_for(self._started, 30, "operator start")
        self.coord_port = int(started["coord_port"])
        self.metrics_port = int(started["metrics_port"])

    def _started(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited ({self.proc.returncode}):\n{self.text()}")
        for line in self.text().splitlines():
            if '"operator started"' in line:
                return json.loads(line)
        return None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: a crashed operator pod (its Lease is not released)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """PChannels, node pods and operators in one namespace of the real API server."""

    def __init__(
        self,
        cp: ControlPlane,
        namespace: str,
        kubectl: Kubectl,
        kube_bin: Path,
        tmp: Path,
        rbac: bool = True,
    ) -> None:
        self.cp = cp
        self.ns = namespace
        self.kubectl = kubectl
        self.tmp = tmp
        self.api = cp.api(cp.admin_kubeconfig(tmp / "admin-api.kubeconfig", namespace))
        self.co = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.nodes: dict[int, LocalNode] = {}
        self.operators: list[OperatorProcess] = []
        self._operator_kubeconfig: Path | None = None
        if rbac:  # else the test installs the chart, RBAC included
            kubectl("apply", "-f", "-", stdin=chart_rbac(kube_bin, namespace))

    @property
    def operator_kubeconfig(self) -> Path:
        """What the chart's operator pod authenticates with: its ServiceAccount's token."""
        if self._operator_kubeconfig is None:
            self._operator_kubeconfig = self.cp.service_account_kubeconfig(
                self.tmp / "operator.kubeconfig", self.ns, OPERATOR_ACCOUNT
            )
        return self._operator_kubeconfig

    # ------------------------------------------------------------ pods
    def add_node(
        self,
        node_id: int,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        node_name: str | None = None,
    ) -> LocalNode:
        """A node process on 127.0.0.<id+1> and its Pod, Ready. `node_name` schedules the
        pod on a (fictitious) Kubernetes node: its deletion is then graceful (the API
        server sets deletionTimestamp and keeps it until deleted with grace 0), as a
        kubelet-run pod's is."""
        node = LocalNode(
            self.tmp / f"node{node_id}" / "data",
            node_id=node_id,
            host=f"127.0.0.{node_id + 1}",
            extra_args=extra_args,
            env=env,
        ).start()
        self.nodes[node_id] = node
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{RELEASE}-streamwal-node-{node_id}",
                "labels": {**NODE_LABELS, "apps.kubernetes.io/pod-index": str(node_id)},
            },
            "spec": {
                **({"nodeName": node_name} if node_name else {}),
                "containers": [
                    {
                        "name": "node",
                        "image": "streamwal:test",
                        "ports": [{"name": "grpc", "containerPort": node.port}],
                    }
                ],
            },
        }
        self.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        self.set_ready(node_id, True)
        return node

    def set_ready(self, node_id: int, ready: bool) -> None:
        node = self.nodes[node_id]
        status = {
            "status": {
                "phase": "Running",
                "podIP": node.host,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            }
        }
        self.core.patch_namespaced_pod_status(
            f"{RELEASE}-streamwal-node-{node_id}",
            self.ns,
            status,
            _content_type="application/merge-patch+json",
        )

    def fail_node(self, node_id: int) -> None:
        """kill -9 the node process and mark its pod NotReady (what the kubelet would do)."""
        self.nodes[node_id].kill()
        self.set_ready(node_id, False)

    # ------------------------------------------------------------ operators
    def start_operator(
        self, *extra: str, lease: str | None = LEASE, env: dict[str, str] | None = None
    ) -> OperatorProcess:
        """`streamwal operator` as the chart runs it (its ServiceAccount, a Lease);
        `lease=None` runs it alone (a restart after a SIGKILL need not wait for the
        dead one's Lease to expire)."""
        log = self.tmp / f"operator{len(self.operators)}.log"
        op = OperatorProcess(self.operator_kubeconfig, self.ns, log, lease, *extra, env=env)
        self.operators.append(op)
        return op

    # ------------------------------------------------------------ PChannels
    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.co.get_namespaced_custom_object(G, V, self.ns, P, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def ready(self, name: str) -> dict[str, Any] | None:
        obj = self.get(name)
        status = (obj or {}).get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        ok = (
            status.get("state") == "Assigned"
            and cond.get("status") == "True"
            and status.get("observedGeneration") == obj["metadata"]["generation"]
        )
        return obj if ok else None

    def events(self, name: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(self.ns).items
            if e.involved_object.name == name
        ]

    def close(self) -> None:
        for op in self.operators:  # all stop at once, then each is waited for
            if op.proc.poll() is None:
                op.proc.terminate()
        for op in self.operators:
            op.stop()
        for node in self.nodes.values():
            node.kill()
        self.api.close()

    def forbidden(self) -> list[str]:
        """Log lines of the operators where the API server refused them (403)."""
        return [line for op in self.operators for line in op.text().splitlines()
                if FORBIDDEN.search(line)]  # fmt: skip

    def logs(self) -> str:
        parts = [f"--- {op.log.name}\n{op.text()[-6000:]}" for op in self.operators]
        parts += [f"--- node {i}\n{n.log_tail(1500)}" for i, n in self.nodes.items()]
        return "\n".join(parts)


@pytest.fixture
def cluster(
    kube_control_plane: ControlPlane,
    pchannel_crd: None,
    kube_ns: str,
    kubectl: Kubectl,
    kube_bin: Path,
    tmp_path: Path,
    request,
) -> Iterator[Cluster]:
    options = getattr(request, "param", {})  # e.g. {"rbac": False}, by indirect parametrize
    c = Cluster(kube_control_plane, kube_ns, kubectl, kube_bin, tmp_path, **options)
    try:
        yield c
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(c.logs())
        c.close()
    assert c.forbidden() == [], "the chart's RBAC refused the operator"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
