"""The Helm chart's operator Deployment passes flags `streamwal operator` accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from streamwal.coord.liveness import DEFAULT_GRACE, DEFAULT_PROBE_INTERVAL
from streamwal.operator.cli import operator
from streamwal.operator.token_bucket import DEFAULT_BURST, DEFAULT_QPS
from tests.kube.conftest import CHART


def test_chart_operator_args_parse(kube_bin: Path) -> None:
    rendered = subprocess.run(
        [str(kube_bin / "helm"), "template", "sw", str(CHART)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    deployments = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("operator")
    ]
    assert len(deployments) == 1
    container = deployments[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["streamwal"] and container["args"][0] == "operator"
    args = [a.replace("$(POD_NAMESPACE)", "streamwal") for a in container["args"][1:]]
    ctx = operator.make_context("operator", args)
    assert ctx.params["namespace"] == "streamwal"
    assert ctx.params["lease"] == "sw-streamwal-operator"
    assert ctx.params["coord_listen"].endswith(":19500")
    assert ctx.params["liveness"] == "http://0.0.0.0:8080/healthz"
    assert ctx.params["node_selector"] == "app.kubernetes.io/component=streaming-node"
    # The chart's failover values are the code's one default (longer than a pod restart).
    assert ctx.params["grace"] == DEFAULT_GRACE >= 20
    assert ctx.params["probe_interval"] == DEFAULT_PROBE_INTERVAL
    # The request rate against the API server: the chart's values are the code's defaults.
    assert (ctx.params["kube_api_qps"], ctx.params["kube_api_burst"]) == (
        DEFAULT_QPS,
        DEFAULT_BURST,
    )


def test_chart_kube_api_values_reach_the_operator(kube_bin: Path) -> None:
    sets = ["--set", "operator.kubeApi.qps=20", "--set", "operator.kubeApi.burst=3"]
    rendered = _template(kube_bin, *sets).stdout
    (deployment,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("operator")
    ]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    ctx = operator.make_context("operator", [a.replace("$(POD_NAMESPACE)", "x") for a in args[1:]])
    assert (ctx.params["kube_api_qps"], ctx.params["kube_api_burst"]) == (20, 3)
    refused = _template(kube_bin, "--set", "operator.kubeApi.burst=0", check=False)
    assert refused.returncode != 0 and "/operator/kubeApi/burst" in refused.stderr


def test_chart_failover_values_reach_operator_and_coord(kube_bin: Path) -> None:
    from streamwal.coord.cli import coord

    sets = ["--set", "failover.grace=45", "--set", "failover.probeInterval=1"]
    rendered = _template(kube_bin, *sets, "--set", "controller=coord").stdout
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    ctx = coord.make_context("coord", args[1:])
    assert (ctx.params["grace"], ctx.params["probe_interval"]) == (45, 1)
    refused = _template(kube_bin, "--set", "failover.grace=0", check=False)
    assert refused.returncode != 0 and "/failover/grace" in refused.stderr, refused.stderr


def _template(kube_bin: Path, *sets: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(kube_bin / "helm"), "template", "sw", str(CHART), *sets],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def _node_container(kube_bin: Path, *sets: str) -> dict:
    rendered = _template(kube_bin, *sets).stdout
    (sts,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "StatefulSet"]
    return sts["spec"]["template"]["spec"]["containers"][0]


def test_chart_node_args_parse_and_open_the_produce_port(kube_bin: Path) -> None:
    from streamwal.node.cli import node, wait_drained

    container = _node_container(kube_bin, "--set", "tls.enabled=false")
    # A deleted node pod waits (bounded) for its leaderships to move before it stops.
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["streamwal", "wait-drained"]
    drain = wait_drained.make_context("wait-drained", hook[2:]).params
    assert drain == {"address": "127.0.0.1:19530", "timeout": 25.0, "settle": 2.0}
    assert "lifecycle" not in _node_container(kube_bin, "--set", "node.drainTimeoutSeconds=0")
    args = [a.replace("$(NODE_ID)", "0") for a in container["args"][1:]]
    ctx = node.make_context("node", args)
    assert ctx.params["listen"] == "0.0.0.0:19530"
    assert ctx.params["produce_listen"] == "0.0.0.0:19531"
    assert ctx.params["internal_listen"] == "0.0.0.0:19532"
    assert {"name": "internal", "containerPort": 19532, "protocol": "TCP"} in container["ports"]
    assert {"name": "produce", "containerPort": 19531, "protocol": "TCP"} in container["ports"]
    assert ctx.params["replication_listen"] == "0.0.0.0:19534"
    assert {"name": "replication", "containerPort": 19534, "protocol": "TCP"} in container["ports"]
    off = _node_container(
        kube_bin,
        *("--set", "tls.enabled=false", "--set", "node.producePort=0"),
        *("--set", "node.replicationPort=0"),
    )
    assert "--produce-listen=off" in off["args"]
    assert "--replication-listen=off" in off["args"]
    assert all(p["name"] not in ("produce", "replication") for p in off["ports"])
