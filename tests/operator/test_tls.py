"""The chart's TLS configuration, end to end.

The chart is installed with its tls.* values on the real API server (Secrets holding
certificates this test makes). The installed StatefulSet's and Deployment's TLS
environment and mounts are then applied to real processes on loopback: every
``STREAMWAL_TLS_*`` path under a Secret's mount becomes that Secret's files here. What
users rely on: the operator assigns over mutual TLS, replicas replicate over it, a
producer with a client certificate appends and reads back, the produce port stays
closed, a peer without a certificate gets nothing and a client certificate cannot
manage nodes; `helm test` (the chart's own check) passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamwal.client import Message
from streamwal.client.aio import connect
from streamwal.client.node_client import NodeClient
from streamwal.errors import StreamingError
from streamwal.transport import TransportConfig
from tests.kube.conftest import CHART
from tests.operator.conftest import RELEASE, Cluster, pchannel_yaml, wait_for
from tests.pki import issue, make_ca

SERVER_NAME = f"{RELEASE}-streamwal"  # the chart's default tls.serverName


ACCESS_FILE = "--access-file=/etc/streamwal/access/access.yaml"


def local_args(spec: dict[str, Any], access_file: Path) -> tuple[str, ...]:
    """The container's --access-file, pointed at the ConfigMap's file written here."""
    (container,) = spec["containers"]
    assert ACCESS_FILE in container["args"]
    return ("--access-file", str(access_file))


def local_env(spec: dict[str, Any], secrets: dict[str, Path]) -> dict[str, str]:
    """The container's literal env, each path under a Secret's mount moved to the
    directory holding that Secret's files here (item paths as the volume maps them)."""
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec.get("volumes", []) if "secret" in v}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])
              if m["name"] in volumes}  # fmt: skip
    env = {}
    for var in container.get("env", []):
        value = var.get("value")
        if value is None:
            continue  # fieldRefs (pod name, ordinal): the test sets those itself
        for mount, volume in mounts.items():
            if value.startswith(mount + "/"):
                item = value[len(mount) + 1 :]
                keys = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
                value = str(secrets[volume["secret"]["secretName"]] / keys.get(item, item))
        env[var["name"]] = value
    return env


@pytest.mark.parametrize("cluster", [{"rbac": False}], indirect=True)
async def test_produce_through_the_charts_tls_configuration(
    cluster: Cluster, kube_bin: Path, tmp_path: Path
) -> None:
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    names = (f"DNS:{SERVER_NAME}",)  # never the pods' IPs: they are not known ahead
    pairs = {
        "wal-node": issue(ca, pki, "node", f"/CN={RELEASE}-streamwal-node", names, True, True),
        "wal-coord": issue(ca, pki, "coord", f"/CN={RELEASE}-streamwal-coord", names, True, True),
        "wal-client": issue(ca, pki, "client", "/CN=an-application", client=True),
    }
    secrets: dict[str, Path] = {}
    for name, files in [("wal-ca", {"ca.crt": ca.cert})] + [
        (n, {"tls.crt": p.cert, "tls.key": p.key}) for n, p in pairs.items()
    ]:
        cluster.kubectl("create", "secret", "generic", name,
                        *(f"--from-file={k}={v}" for k, v in files.items()))  # fmt: skip
        secrets[name] = local = tmp_path / "secrets" / name
        local.mkdir(parents=True)
        for key, path in files.items():
            (local / key).write_bytes(path.read_bytes())
    values = [
        "--set", "tls.issuer=secrets", "--set", "tls.caSecret=wal-ca",
        "--set", "tls.nodeSecret=wal-node", "--set", "tls.coordSecret=wal-coord",
        "--set", "tls.clientSecret=wal-client",
        "--set-json", 'access.identities=[{"names": ["an-application"], '
                      '"roles": {"producer": ["ch-*"], "consumer": ["ch-tls"]}}]',
    ]  # fmt: skip
    helm = cluster.kubectl.tool(kube_bin / "helm")
    helm("install", RELEASE, str(CHART), "-n", cluster.ns, *values, timeout=120)

    def installed(kind: str, name: str) -> dict[str, Any]:
        obj = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)
        return obj["spec"]["template"]["spec"]

    node_spec = installed("statefulset", f"{RELEASE}-streamwal-node")
    operator_spec = installed("deployment", f"{RELEASE}-streamwal-operator")
    node_env = local_env(node_spec, secrets)
    assert node_env["STREAMWAL_TLS_SERVER_NAME"] == SERVER_NAME
    assert "--produce-listen=off" in node_spec["containers"][0]["args"]
    access_file = tmp_path / "access.yaml"
    access_file.write_text(
        json.loads(cluster.kubectl("get", "configmap", f"{RELEASE}-streamwal-access",
                                   "-o", "json").stdout)["data"]["access.yaml"]
    )  # fmt: skip
    for i in (1, 2, 3):
        args = ("--produce-listen=off", *local_args(node_spec, access_file))
        cluster.add_node(i, env=node_env, extra_args=args)
    op = cluster.start_operator(
        *local_args(operator_spec, access_file), env=local_env(operator_spec, secrets)
    )
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-tls", replicas=3))
    obj = wait_for(lambda: cluster.ready("ch-tls"), 40, "ch-tls Ready over mTLS")
    assert len(obj["status"]["replicas"]) == 3
    for node in cluster.nodes.values():
        assert '"produce_port": 0' in node.log_tail(20000)  # the produce port stays closed

    app = pairs["wal-client"]
    transport = TransportConfig(str(app.cert), str(app.key), str(ca.cert), SERVER_NAME)
    async with await connect(coord=f"127.0.0.1:{op.coord_port}", transport=transport) as wal:
        sent = [await wal.raw_append(Message("ch-tls_v1", f"m{i}".encode())) for i in range(20)]
    leader = cluster.nodes[obj["status"]["node"]["id"]]
    async with NodeClient(leader.address, transport) as client:
        consumer = await client.consumer(
            "ch-tls", obj["status"]["term"], end_offset=sent[-1].message_id + 1, time_ticks=False
        )
        got = [m.payload async for m in consumer]
        # An application's certificate cannot manage or fence nodes.
        with pytest.raises(StreamingError, match="PERMISSION_DENIED: an-application may not"):
            await client.remove("ch-tls", obj["status"]["term"])
        with pytest.raises(StreamingError, match="PERMISSION_DENIED: an-application may not"):
            await client.fence("ch-tls", obj["status"]["term"] + 5)
    assert [p for p in got if p.startswith(b"m")] == [f"m{i}".encode() for i in range(20)]
    # Without a certificate of the CA a peer gets nothing.
    anonymous = TransportConfig(None, None, str(ca.cert), SERVER_NAME)
    async with NodeClient(leader.address, anonymous) as client:
        with pytest.raises(StreamingError):
            await client.collect_status()

    # `helm test`: the chart's own check, run here with its pod's env and command.
    hooks = helm("get", "hooks", RELEASE, "-n", cluster.ns).stdout
    (test_pod,) = [d for d in yaml.safe_load_all(hooks) if d and d["kind"] == "Pod"]
    command = test_pod["spec"]["containers"][0]
    check = subprocess.run(
        [sys.executable, *command["command"][1:], command["args"][0],
         f"127.0.0.1:{op.coord_port}"],
        env={**local_env(test_pod["spec"], secrets), "PATH": ""},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0 and "SERVING" in check.stdout, check.stdout + check.stderr
