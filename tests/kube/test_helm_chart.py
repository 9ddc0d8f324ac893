"""The Helm chart: lints, refuses bad values, renders what production relies on, installs
and upgrades on the real kube-apiserver, and its alerting rules pass promtool."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamwal.access import parse
from tests.control_plane import ControlPlane
from tests.kube.conftest import CHART, CRD_FILE, Kubectl, install_crd, kubectl_for, wait_for

MONITORING_API = [
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
]
TLS = [
    "--set", "tls.issuer=secrets", "--set", "tls.caSecret=wal-ca",
    "--set", "tls.nodeSecret=wal-node", "--set", "tls.coordSecret=wal-coord",
    "--set", "tls.clientSecret=wal-client",
]  # fmt: skip
PLAINTEXT = ["--set", "tls.enabled=false"]


def helm(kube_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(kube_bin / "helm"), *args], capture_output=True, text=True, timeout=60
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def render(kube_bin: Path, *extra: str) -> list[dict[str, Any]]:
    text = helm(kube_bin, "template", "wal", str(CHART), "--namespace", "streaming", *extra).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(hits) == 1, (kind, suffix, [d["metadata"]["name"] for d in hits])
    return hits[0]


def pod_spec(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    return find(docs, kind, suffix)["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "values",
    [["--set", "controller=operator"], ["--set", "controller=coord"], TLS],
    ids=["operator", "coord", "tls"],
)
def test_chart_lints(kube_bin: Path, values: list[str]) -> None:
    helm(kube_bin, "lint", "--strict", str(CHART), *values)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("controller=bogus", "at '/controller': value must be one of 'operator', 'coord'"),
        ("node.durability=bogus", "at '/node/durability': value must be one of 'sync', 'async'"),
        ("tls.issuer=secrets", "at '/tls/"),  # secrets: they must be named
        ("tls.issuer=vault", "at '/tls/issuer'"),
        ("node.retention.age=7 days", "at '/node/retention/age'"),
        ("node.replicas=0", "at '/node/replicas': minimum"),
        ("node.replicationPort=70000", "at '/node/replicationPort': maximum"),
        ("pchannel.replicas=2", "at '/pchannel/replicas'"),
        ("metrics.prometheusRule.enabled=maybe", "at '/metrics/prometheusRule/enabled'"),
        ("operator.nodeSelector=streaming", "at '/operator/nodeSelector'"),
        ("nodes.replicas=3", "additional properties 'nodes' not allowed"),
    ],
)
def test_the_schema_refuses_bad_values(kube_bin: Path, value: str, message: str) -> None:
    out = helm(kube_bin, "template", "wal", str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_chart_ships_the_project_crd(kube_bin: Path) -> None:
    shipped = (CHART / "crds" / CRD_FILE.name).read_text()
    assert shipped == CRD_FILE.read_text()
    assert [p.name for p in (CHART / "crds").iterdir()] == [CRD_FILE.name]


def test_streaming_nodes_render_as_production_needs(kube_bin: Path) -> None:
    """Plaintext (the opt-out): the produce port is open and gRPC probes are native."""
    docs = render(kube_bin, *PLAINTEXT)
    sts = find(docs, "StatefulSet", "-node")
    pod = sts["spec"]["template"]
    assert sts["spec"]["replicas"] == 3
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "streaming-node"
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": 19530,
        "produce": 19531,
        "internal": 19532,
        "probe": 19533,
        "replication": 19534,
        "metrics": 9091,
    }
    args = container["args"]
    assert args[:7] == [
        "node",
        "--listen=0.0.0.0:19530",
        "--internal-listen=0.0.0.0:19532",
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
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/tmp"}
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    headless = find(docs, "Service", "-node-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert find(docs, "PodDisruptionBudget", "-node")["spec"]["maxUnavailable"] == 1
    internal, clients = find(docs, "NetworkPolicy", "-node")["spec"]["ingress"][:2]
    assert {p["port"] for p in clients["ports"]} == {"grpc", "produce"}
    # The internal port: this release's pods in this namespace only (no namespaceSelector).
    assert [p["port"] for p in internal["ports"]] == ["internal", "replication", "probe"]
    assert internal["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "streamwal",
                                         "app.kubernetes.io/instance": "wal"}}}
    ]  # fmt: skip
    service = find(docs, "Service", "-node-headless-internal")
    assert [p["port"] for p in service["spec"]["ports"]] == [19532]


def test_pod_values_reach_every_component(kube_bin: Path) -> None:
    """extraEnv, extraVolumes/Mounts, affinity, topology spread, PriorityClass and pod
    annotations of the node, operator and coord pods, and the ServiceAccount values."""
    sets: list[str] = []
    for component in ("node", "operator", "coord"):
        sets += [
            "--set-json", f'{component}.extraEnv=[{{"name":"X_{component.upper()}","value":"1"}}]',
            "--set-json", f'{component}.extraVolumes=[{{"name":"extra","emptyDir":{{}}}}]',
            "--set-json", f'{component}.extraVolumeMounts=[{{"name":"extra","mountPath":"/x"}}]',
            "--set-json", f'{component}.affinity={{"nodeAffinity":{{"x":"{component}"}}}}',
            "--set-json", f'{component}.topologySpreadConstraints=[{{"maxSkew":1}}]',
            "--set", f"{component}.priorityClassName=pc-{component}",
            "--set", f"{component}.podAnnotations.team={component}",
        ]  # fmt: skip
    sa = ["--set", "serviceAccount.name=wal-sa", "--set", "serviceAccount.annotations.iam=r"]
    for controller, kind, component in (("operator", "Deployment", "operator"),
                                        ("coord", "Deployment", "coord")):  # fmt: skip
        docs = render(kube_bin, *sets, *sa, "--set", f"controller={controller}")
        for kind_, suffix, name in ((kind, f"-{component}", component),
                                    ("StatefulSet", "-node", "node")):  # fmt: skip
            tmpl = find(docs, kind_, suffix)["spec"]["template"]
            spec = tmpl["spec"]
            (container,) = spec["containers"]
            assert {"name": f"X_{name.upper()}", "value": "1"} in container["env"]
            assert {"name": "extra", "emptyDir": {}} in spec["volumes"]
            assert {"name": "extra", "mountPath": "/x"} in container["volumeMounts"]
            assert spec["affinity"]["nodeAffinity"] == {"x": name}
            assert spec["topologySpreadConstraints"] == [{"maxSkew": 1}]
            assert spec["priorityClassName"] == f"pc-{name}"
            assert tmpl["metadata"]["annotations"]["team"] == name
    docs = render(kube_bin, *sa)
    assert pod_spec(docs, "Deployment", "-operator")["serviceAccountName"] == "wal-sa"
    account = find(docs, "ServiceAccount", "wal-sa")
    assert account["metadata"]["annotations"] == {"iam": "r"}
    assert find(docs, "RoleBinding", "-operator")["subjects"][0]["name"] == "wal-sa"
    docs = render(kube_bin, *sa, "--set", "serviceAccount.create=false")
    assert [d for d in docs if d["kind"] == "ServiceAccount" and "wal-sa" in str(d)] == []
    assert find(docs, "RoleBinding", "-operator")["subjects"][0]["name"] == "wal-sa"


def test_node_anti_affinity_presets_merge_with_raw_affinity(kube_bin: Path) -> None:
    node_affinity = '{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{}}}'
    spec = pod_spec(
        render(kube_bin, "--set-json", f"node.affinity={node_affinity}",
               "--set", "node.antiAffinity=required"),
        "StatefulSet", "-node",
    )  # fmt: skip
    assert set(spec["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["podAntiAffinity"]
    clash = '{"podAntiAffinity":{}}'
    out = helm(kube_bin, "template", "wal", str(CHART), "--set-json",
               f"node.affinity={clash}", check=False)  # fmt: skip
    assert out.returncode != 0 and "set node.antiAffinity=none" in out.stderr
    spec = pod_spec(
        render(kube_bin, "--set-json", f"node.affinity={clash}", "--set", "node.antiAffinity=none"),
        "StatefulSet", "-node",
    )  # fmt: skip
    assert spec["affinity"] == {"podAntiAffinity": {}}


def test_tls_mounts_the_secrets_and_closes_the_produce_port(kube_bin: Path) -> None:
    docs = render(kube_bin, *TLS)
    for kind, suffix, secret in (("StatefulSet", "-node", "wal-node"),
                                 ("Deployment", "-operator", "wal-coord")):  # fmt: skip
        spec = pod_spec(docs, kind, suffix)
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["STREAMWAL_TLS_CA"] == "/etc/streamwal/tls/ca/ca.crt"
        assert env["STREAMWAL_TLS_CERT"] == "/etc/streamwal/tls/cert/tls.crt"
        assert env["STREAMWAL_TLS_KEY"] == "/etc/streamwal/tls/cert/tls.key"
        assert env["STREAMWAL_TLS_SERVER_NAME"] == "wal-streamwal"
        volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in spec["volumes"]}
        assert volumes["tls-ca"] == "wal-ca" and volumes["tls-cert"] == secret
    node = pod_spec(docs, "StatefulSet", "-node")["containers"][0]
    assert "--produce-listen=off" in node["args"]
    assert "--replication-listen=off" in node["args"]
    assert all(p["name"] not in ("produce", "replication") for p in node["ports"])
    # Every server reads the access file: the release's own certificates are `cluster`.
    for kind, suffix in (("StatefulSet", "-node"), ("Deployment", "-operator")):
        spec = pod_spec(docs, kind, suffix)
        assert "--access-file=/etc/streamwal/access/access.yaml" in spec["containers"][0]["args"]
        volumes = {v["name"]: v.get("configMap", {}).get("name") for v in spec["volumes"]}
        assert volumes["access"] == "wal-streamwal-access"
    text = find(docs, "ConfigMap", "-access")["data"]["access.yaml"]
    parse(text)  # what the servers will read: no AccessError
    access = yaml.safe_load(text)
    cluster = {"names": ["wal-streamwal-node", "wal-streamwal-coord"], "roles": ["cluster"]}
    assert access == {"identities": [cluster]}
    assert {p["name"] for p in node["ports"]} == {"grpc", "internal", "probe", "metrics"}
    assert node["readinessProbe"]["tcpSocket"]["port"] == 19530  # no TLS in gRPC probes
    policy = find(docs, "NetworkPolicy", "-node")["spec"]["ingress"][1]
    assert {p["port"] for p in policy["ports"]} == {"grpc"}
    test_pod = find(docs, "Pod", "-test-coord-health")["spec"]
    assert test_pod["volumes"][1]["secret"]["secretName"] == "wal-client"
    no_client = render(kube_bin, *TLS[:-2])
    assert not [d for d in no_client if d["kind"] == "Pod"]  # no client certificate: no test


def test_security_is_on_by_default_with_certificates_the_chart_issues(
    kube_bin: Path, tmp_path: Path
) -> None:
    """Default values: mutual TLS with a CA and node, coord and client certificates the
    chart makes (each verifying against the CA, the servers' carrying the server name,
    names matching the access file's cluster identities), the access file passed."""
    docs = render(kube_bin)
    secrets = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}
    parts = ("ca", "node", "coord", "client")
    assert set(secrets) == {f"wal-streamwal-tls-{p}" for p in parts}
    for part in parts:
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (tmp_path / f"{part}.{key}").write_bytes(
                base64.b64decode(secrets[f"wal-streamwal-tls-{part}"][key])
            )
    ca = str(tmp_path / "ca.tls.crt")
    for part in ("node", "coord", "client"):
        leaf = str(tmp_path / f"{part}.tls.crt")
        check = subprocess.run(["openssl", "verify", "-CAfile", ca, leaf],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        text = subprocess.run(["openssl", "x509", "-in", leaf, "-noout", "-subject", "-ext",
                               "subjectAltName"], capture_output=True, text=True,
                              timeout=30).stdout  # fmt: skip
        assert f"CN = wal-streamwal-{part}" in text
        assert ("DNS:wal-streamwal" in text) is (part != "client")
    node = pod_spec(docs, "StatefulSet", "-node")
    (container,) = node["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMWAL_TLS_CA"] == "/etc/streamwal/tls/ca/ca.crt"
    assert "--access-file=/etc/streamwal/access/access.yaml" in container["args"]
    assert "--produce-listen=off" in container["args"]
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in node["volumes"]}
    assert volumes["tls-ca"] == "wal-streamwal-tls-ca"
    assert volumes["tls-cert"] == "wal-streamwal-tls-node"
    test_pod = find(docs, "Pod", "-test-coord-health")["spec"]
    assert {v.get("secret", {}).get("secretName") for v in test_pod["volumes"]} >= {
        "wal-streamwal-tls-client"
    }
    plain = render(kube_bin, *PLAINTEXT)
    assert not [d for d in plain if d["kind"] in ("Secret", "ConfigMap") and "tls" in
                d["metadata"]["name"] + str(d.get("data", {}).keys())]  # fmt: skip


def test_cert_manager_issues_the_certificates_when_picked(kube_bin: Path) -> None:
    values = ["--set", "tls.issuer=cert-manager", "--set", "tls.certManager.issuerRef.name=ca",
              "--set", "tls.certManager.issuerRef.kind=ClusterIssuer"]  # fmt: skip
    docs = render(kube_bin, *values)
    certs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert set(certs) == {"wal-streamwal-node", "wal-streamwal-coord", "wal-streamwal-client"}
    assert certs["wal-streamwal-node"]["secretName"] == "wal-streamwal-tls-node"
    assert certs["wal-streamwal-node"]["dnsNames"] == ["wal-streamwal"]
    assert certs["wal-streamwal-coord"]["commonName"] == "wal-streamwal-coord"
    assert certs["wal-streamwal-client"]["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer"}
    assert not [d for d in docs if d["kind"] == "Secret"]
    node = pod_spec(docs, "StatefulSet", "-node")
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in node["volumes"]}
    assert volumes["tls-ca"] == volumes["tls-cert"] == "wal-streamwal-tls-node"
    refused = helm(kube_bin, "template", "wal", str(CHART), *values[:2], check=False)
    assert refused.returncode != 0 and "needs tls.certManager.issuerRef.name" in refused.stderr


def test_operator_rbac_is_least_privilege(kube_bin: Path) -> None:
    docs = render(kube_bin)
    role = find(docs, "Role", "-operator")
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                key = (
                    g,
                    r + ("@" + ",".join(rule["resourceNames"]) if "resourceNames" in rule else ""),
                )
                rules[key] = rules.get(key, set()) | set(rule["verbs"])
    assert rules == {
        ("streamwal.io", "pchannels"): {"get", "list", "watch", "patch"},
        ("streamwal.io", "pchannels/status"): {"patch"},
        ("", "pods"): {"list", "watch"},
        ("", "events"): {"create"},
        ("coordination.k8s.io", "leases"): {"create"},
        ("coordination.k8s.io", "leases@wal-streamwal-operator"): {"get", "update"},
        ("", "configmaps"): {"list", "create", "update", "delete"},
    }
    # Nothing cluster-wide: Kopf watches one namespace, with cluster scanning off.
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    node_account = find(docs, "ServiceAccount", "-node")
    assert node_account["automountServiceAccountToken"] is False


def test_coord_mode_replaces_the_operator(kube_bin: Path) -> None:
    docs = render(kube_bin, "--set", "controller=coord")
    assert not [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    coord = find(docs, "Deployment", "-coord")
    assert coord["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
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


def test_monitoring_objects_follow_the_api(kube_bin: Path) -> None:
    """auto: created where monitoring.coreos.com/v1 is served; true: refused without it."""
    kinds = {d["kind"] for d in render(kube_bin)}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    kinds = {d["kind"] for d in render(kube_bin, *MONITORING_API)}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    out = helm(kube_bin, "template", "wal", str(CHART), "--set",
               "metrics.prometheusRule.enabled=true", check=False)  # fmt: skip
    assert out.returncode != 0
    assert "metrics.prometheusRule.enabled=true, but this cluster does not serve" in out.stderr
    kinds = {d["kind"] for d in render(kube_bin, *MONITORING_API, "--set",
                                       "metrics.serviceMonitor.enabled=false")}  # fmt: skip
    assert "ServiceMonitor" not in kinds and "PrometheusRule" in kinds


ALERTS = {
    "StreamwalPChannelNotReady",
    "StreamwalFailoverStorm",
    "StreamwalConsumerLag",
    "StreamwalDiskFilling",
    "StreamwalUncleanFailover",
    "StreamwalReplicaLag",
    "StreamwalPChannelUnderReplicated",
    "StreamwalNodeDown",
}


@pytest.mark.parametrize("controller", ["operator", "coord"])
def test_alert_rules_pass_promtool(kube_bin: Path, tmp_path: Path, controller: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool (Debian package prometheus) is not installed; scripts/setup "
            "--test installs it"
        )
    docs = render(kube_bin, *MONITORING_API, "--set", f"controller={controller}")
    groups = find(docs, "PrometheusRule")["spec"]["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    # Under-replication compares with spec.replicas, which only the operator exports.
    assert alerts == ALERTS - (
        {"StreamwalPChannelUnderReplicated"} if controller == "coord" else set()
    )
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in proc.stdout


def test_grafana_dashboard_is_valid_json(kube_bin: Path) -> None:
    cm = find(render(kube_bin), "ConfigMap", "-dashboard")
    dashboard = json.loads(cm["data"]["streamwal.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "streamwal_pchannel_info",
        "streamwal_appended_messages_total",
        "streamwal_consumer_lag_messages",
        "streamwal_log_size_bytes",
        "streamwal_coord_failovers_total",
        "streamwal_delivered_messages_total",
        "streamwal_group_lag_messages",
        "streamwal_replica_lag",
        "streamwal_fsync_latency_seconds_bucket",
        "streamwal_coord_unclean_failovers_total",
    ):
        assert metric in exprs


# ------------------------------------------------------------------ the real API server

MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "kind": kind,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
            },
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


def versions(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """{kind/name: resourceVersion} of everything a release may create in `namespace`."""
    kinds = "sts,deploy,svc,pdb,netpol,cm,sa,role,rolebinding"
    out = kubectl("get", kinds, "-n", namespace, "-o", "json").stdout
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for o in json.loads(out)["items"]
        if not o["metadata"]["name"].startswith("kube-root-ca")
    }


def monitoring_crds_absent(cp: ControlPlane) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = cp.api()
    try:
        ext = client.ApiextensionsV1Api(api)
        for crd in MONITORING_CRDS:
            try:
                ext.delete_custom_resource_definition(crd["metadata"]["name"])
            except ApiException as err:
                if err.status != 404:
                    raise

        def gone() -> bool:
            names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
            return not names & {c["metadata"]["name"] for c in MONITORING_CRDS}

        wait_for(gone, 60, "monitoring CRDs deleted")
    finally:
        api.close()


def test_helm_install_and_upgrade_on_the_api_server(
    kube_control_plane: ControlPlane, kube_bin: Path, tmp_path: Path
) -> None:
    """Default values (security on: certificates the chart issues), TLS with the user's
    Secrets, monitoring on (with and without the Prometheus Operator's CRDs): every object
    is accepted by the real API server (pods stay Pending: no kubelet runs them); an
    upgrade with unchanged values changes nothing, the certificates included; the
    NetworkPolicy read back admits the nodes' internal port from no other namespace."""
    cp = kube_control_plane
    monitoring_crds_absent(cp)
    ns = {name: cp.create_namespace() for name in ("default", "tls", "monitoring")}
    kubectl = kubectl_for(cp, cp.kubeconfig, tmp_path / "home")
    helm_run = kubectl.tool(kube_bin / "helm")

    def install(name: str, *values: str, verb: str = "install") -> str:
        out = helm_run(verb, "wal", str(CHART), "-n", ns[name], *values, timeout=120)
        return out.stdout

    def secrets() -> dict[str, tuple[str, dict[str, str]]]:
        out = kubectl("get", "secrets", "-n", ns["default"], "-o", "json").stdout
        return {s["metadata"]["name"]: (s["metadata"]["resourceVersion"], s["data"])
                for s in json.loads(out)["items"] if "-tls-" in s["metadata"]["name"]}  # fmt: skip

    notes = install("default")
    assert "STATUS: deployed" in notes and "ServiceMonitor: not created" in notes
    assert "Security is on: mutual TLS (certificates: helm)" in notes
    issued = secrets()
    assert set(issued) == {f"wal-streamwal-tls-{p}" for p in ("ca", "node", "coord", "client")}
    before = versions(kubectl, ns["default"])
    expected = ("StatefulSet/wal-streamwal-node", "Deployment/wal-streamwal-operator",
                "Service/wal-streamwal-coord", "Role/wal-streamwal-operator",
                "ConfigMap/wal-streamwal-access",
                "Service/wal-streamwal-node-headless-internal")  # fmt: skip
    assert set(expected) <= set(before)
    node = json.loads(kubectl("get", "statefulset", "wal-streamwal-node", "-n", ns["default"],
                              "-o", "json").stdout)["spec"]["template"]["spec"]  # fmt: skip
    assert "--access-file=/etc/streamwal/access/access.yaml" in node["containers"][0]["args"]
    assert "REVISION: 2" in install("default", verb="upgrade")
    assert versions(kubectl, ns["default"]) == before  # nothing changed
    assert secrets() == issued  # the certificates are kept (lookup), not made anew
    pods = kubectl("get", "pods", "-n", ns["default"], "-o", "json").stdout
    assert json.loads(pods)["items"] == []  # no controller-manager: no pods, nothing runs

    # The internal port, as the API server stored the policy: admitted only from pods of
    # this release in this namespace (a podSelector alone); no rule admits it otherwise.
    policy = json.loads(kubectl("get", "networkpolicy", "wal-streamwal-node", "-n",
                                ns["default"], "-o", "json").stdout)["spec"]  # fmt: skip
    internal = [r for r in policy["ingress"] if {"port": "internal", "protocol": "TCP"}
                in r.get("ports", [])]  # fmt: skip
    assert len(internal) == 1
    assert internal[0]["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/instance": "wal", "app.kubernetes.io/name": "streamwal"}}}]  # fmt: skip
    for rule in policy["ingress"]:
        assert rule.get("ports"), rule  # no rule admits every port
        if any(p["port"] == "internal" for p in rule["ports"]):
            assert all(set(peer) == {"podSelector"} for peer in rule["from"])

    for secret in ("wal-ca", "wal-node", "wal-coord", "wal-client"):
        files = ("ca.crt", "tls.crt", "tls.key")
        kubectl("create", "secret", "generic", secret, "-n", ns["tls"],
                *(f"--from-literal={f}=x" for f in files))  # fmt: skip
    assert "Security is on: mutual TLS (certificates: secrets)" in install("tls", *TLS)
    install("tls", *TLS, verb="upgrade")

    on = ["--set", "metrics.serviceMonitor.enabled=true",
          "--set", "metrics.prometheusRule.enabled=true"]  # fmt: skip
    refused = helm_run("install", "wal", str(CHART), "-n", ns["monitoring"], *on, check=False)
    assert refused.returncode != 0
    assert "does not serve monitoring.coreos.com/v1 ServiceMonitor" in refused.stderr
    install("monitoring")  # auto: installed without them
    for crd in MONITORING_CRDS:
        install_crd(cp, crd)
    try:
        out = install("monitoring", *on, verb="upgrade")
        assert "PrometheusRule: created" in out
        names = kubectl("get", "prometheusrule,servicemonitor", "-n", ns["monitoring"], "-o",
                        "name").stdout.split()  # fmt: skip
        assert sorted(names) == [
            "prometheusrule.monitoring.coreos.com/wal-streamwal",
            "servicemonitor.monitoring.coreos.com/wal-streamwal",
        ]
        install("monitoring", *on, verb="upgrade")
    finally:
        monitoring_crds_absent(cp)


def test_the_new_alerts_fire_on_the_series_they_watch(kube_bin: Path, tmp_path: Path) -> None:
    """promtool's rule unit tests: each alert fires on the series it is about, after its
    `for`, with the labels that route it (annotations are left out here: their templates
    are checked by `promtool check rules` above)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    groups = find(render(kube_bin, *MONITORING_API), "PrometheusRule")["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    ns = 'namespace="sw"'
    series = {
        # pchannel a wants 3 replicas, 2 nodes serve it; pchannel b wants 3, 3 serve it
        f'streamwal_pchannel_replicas_wanted{{pchannel="a",{ns},pod="op-0"}}': "3x12",
        f'streamwal_pchannel_replicas_wanted{{pchannel="b",{ns},pod="op-0"}}': "3x12",
        f'streamwal_replica_role{{pchannel="a",role="leader",{ns},pod="n-0"}}': "1x12",
        f'streamwal_replica_role{{pchannel="a",role="follower",{ns},pod="n-0"}}': "0x12",
        f'streamwal_replica_role{{pchannel="a",role="follower",{ns},pod="n-1"}}': "1x12",
        **{
            f'streamwal_replica_role{{pchannel="b",role="{r}",{ns},pod="n-{i}"}}': "1x12"
            for i, r in enumerate(("leader", "follower", "follower"))
        },
        # 3 nodes, one lost from minute 2; one unclean failover at minute 3
        f'streamwal_coord_nodes_live{{{ns},pod="op-0"}}': "3 3 2x10",
        f'streamwal_coord_unclean_failovers_total{{{ns},pod="op-0"}}': "0 0 0 1x9",
        f'streamwal_replica_lag{{pchannel="a",replica="1",{ns},pod="n-0"}}': "0 0 20000x10",
    }
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "StreamwalPChannelUnderReplicated",
                     "exp_alerts": []},
                    {"eval_time": "6m", "alertname": "StreamwalPChannelUnderReplicated",
                     "exp_alerts": [{"exp_labels": {"severity": "warning", "pchannel": "a",
                                                    "namespace": "sw"}}]},
                    {"eval_time": "3m", "alertname": "StreamwalNodeDown", "exp_alerts": []},
                    {"eval_time": "5m", "alertname": "StreamwalNodeDown",
                     "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": "sw"}}]},
                    {"eval_time": "2m", "alertname": "StreamwalUncleanFailover", "exp_alerts": []},
                    {"eval_time": "4m", "alertname": "StreamwalUncleanFailover",
                     "exp_alerts": [{"exp_labels": {"severity": "critical", "namespace": "sw"}}]},
                    {"eval_time": "6m", "alertname": "StreamwalReplicaLag", "exp_alerts": []},
                    {"eval_time": "8m", "alertname": "StreamwalReplicaLag",
                     "exp_alerts": [{"exp_labels": {"severity": "warning", "pchannel": "a",
                                                    "namespace": "sw"}}]},
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
