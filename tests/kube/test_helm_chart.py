"""The Helm chart: lints, renders what production relies on, applies to an API server,
and its alerting rules pass promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.conftest import CHART, CRD_FILE, Kubectl

ALL_ON = [
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.prometheusRule.enabled=true",
]


def helm(kube_bin: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(kube_bin / "helm"), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def render(kube_bin: Path, *extra: str) -> list[dict[str, Any]]:
    text = helm(kube_bin, "template", "wal", str(CHART), "--namespace", "streaming", *extra)
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(hits) == 1, (kind, suffix, [d["metadata"]["name"] for d in hits])
    return hits[0]


@pytest.mark.parametrize("mode", ["operator", "coord"])
def test_chart_lints(kube_bin: Path, mode: str) -> None:
    helm(kube_bin, "lint", "--strict", str(CHART), "--set", f"controller={mode}", *ALL_ON)


def test_chart_ships_the_project_crd(kube_bin: Path) -> None:
    shipped = (CHART / "crds" / CRD_FILE.name).read_text()
    assert shipped == CRD_FILE.read_text()


def test_streaming_nodes_render_as_production_needs(kube_bin: Path) -> None:
    docs = render(kube_bin)
    sts = find(docs, "StatefulSet", "-node")
    pod = sts["spec"]["template"]
    assert sts["spec"]["replicas"] == 3
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "streaming-node"
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 19530, "produce": 19531, "metrics": 9091}
    args = container["args"]
    assert args[:6] == [
        "node",
        "--listen=0.0.0.0:19530",
        "--data-dir=/data",
        "--node-id=$(NODE_ID)",
        "--metrics=0.0.0.0:9091",
        "--produce-listen=0.0.0.0:19531",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert "apps.kubernetes.io/pod-index" in env["NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == 19530
    sec = container["securityContext"]
    assert sec["readOnlyRootFilesystem"] and sec["runAsNonRoot"]
    assert not sec["allowPrivilegeEscalation"] and sec["capabilities"]["drop"] == ["ALL"]
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/tmp"}
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    headless = find(docs, "Service", "-node-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert find(docs, "PodDisruptionBudget", "-node")["spec"]["maxUnavailable"] == 1


def test_operator_rbac_is_least_privilege(kube_bin: Path) -> None:
    docs = render(kube_bin)
    role = find(docs, "Role", "-operator")
    rules = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules[("streamwal.io", "pchannels")] == {"get", "list", "watch", "patch"}
    assert "update" not in rules[("streamwal.io", "pchannels")]  # never replaces spec
    assert rules[("", "pods")] == {"get", "list", "watch"}
    # Broadcast tasks are ConfigMaps: written and pruned, never watched.
    assert rules[("", "configmaps")] == {"get", "list", "create", "update", "patch", "delete"}
    cluster = find(docs, "ClusterRole")
    everything = [
        v
        for d in (role, cluster)
        for rule in d["rules"]
        for v in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    ]
    assert "*" not in everything and "secrets" not in everything
    assert {v for rule in cluster["rules"] for v in rule["verbs"]} <= {"get", "list", "watch"}


def test_coord_mode_replaces_the_operator(kube_bin: Path) -> None:
    docs = render(kube_bin, "--set", "controller=coord")
    assert not [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    coord = find(docs, "Deployment", "-coord")
    args = coord["spec"]["template"]["spec"]["containers"][0]["args"]
    nodes = next(a for a in args if a.startswith("--nodes="))
    assert nodes == (
        "--nodes="
        + ",".join(
            f"{i}=wal-streamwal-node-{i}.wal-streamwal-node-headless.streaming.svc:19530"
            for i in range(3)
        )
    )
    service = find(docs, "Service", "-coord")
    assert service["spec"]["selector"]["streamwal.io/serves-coord"] == "true"


MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    for plural, kind in (
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    )
]


def test_rendered_chart_applies_with_kubectl(
    kube_bin: Path, kubectl: Kubectl, tmp_path: Path
) -> None:
    # What `helm install` does: CRDs first (the chart's and the Prometheus Operator's), then
    # the templates, all validated by the server (kubectl's default --validate=strict).
    kubectl("apply", "-f", str(CHART / "crds"))
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(MONITORING_CRDS))
    # (kubectl apply, not create: imperative creates of built-ins send protobuf, which the
    # emulator does not speak.)
    namespace = "{apiVersion: v1, kind: Namespace, metadata: {name: streaming}}"
    kubectl("apply", "-f", "-", stdin=namespace)
    rendered = tmp_path / "chart.yaml"
    rendered.write_text(
        helm(kube_bin, "template", "wal", str(CHART), "--namespace", "streaming", *ALL_ON)
    )
    out = kubectl("apply", "-n", "streaming", "-f", str(rendered)).stdout
    assert "statefulset.apps/wal-streamwal-node created" in out
    assert "kopfpeering.kopf.dev/wal-streamwal created" in out
    assert "prometheusrule.monitoring.coreos.com/wal-streamwal created" in out
    names = kubectl(
        "get", "sts,deploy,svc,pdb,netpol,cm,sa,role,rolebinding", "-n", "streaming", "-o", "name"
    ).stdout.split()
    assert "statefulset.apps/wal-streamwal-node" in names
    assert "deployment.apps/wal-streamwal-operator" in names
    assert "service/wal-streamwal-coord" in names
    # Applying again changes nothing (helm upgrade with unchanged values). kubectl says
    # "configured" for PodDisruptionBudgets (their selector patches as a whole), so the
    # proof is that no object got a new resourceVersion.
    versions = "{range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}"
    kinds = "sts,deploy,svc,pdb,netpol,cm,sa,role,rolebinding,prometheusrule,servicemonitor"
    before = kubectl("get", kinds, "-n", "streaming", "-o", f"jsonpath={versions}").stdout
    again = kubectl("apply", "-n", "streaming", "-f", str(rendered)).stdout
    assert "created" not in again, again
    after = kubectl("get", kinds, "-n", "streaming", "-o", f"jsonpath={versions}").stdout
    assert before == after and len(before.split()) == 15, (before, after)


def test_alert_rules_pass_promtool(kube_bin: Path, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool (Debian package prometheus) is not installed; scripts/setup "
            "--test installs it"
        )
    rule = find(render(kube_bin, *ALL_ON), "PrometheusRule")
    groups = rule["spec"]["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert alerts == {
        "StreamwalPChannelNotReady",
        "StreamwalFailoverStorm",
        "StreamwalConsumerLag",
        "StreamwalDiskFilling",
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout


def test_grafana_dashboard_is_valid_json(kube_bin: Path) -> None:
    import json

    cm = find(render(kube_bin), "ConfigMap", "-dashboard")
    dashboard = json.loads(cm["data"]["streamwal.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "streamwal_pchannel_info",
        "streamwal_appended_messages_total",
        "streamwal_consumer_lag_messages",
        "streamwal_log_size_bytes",
        "streamwal_coord_failovers_total",
    ):
        assert metric in exprs
