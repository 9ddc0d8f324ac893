"""Kubernetes discovery with a kubeconfig that carries its credentials inline (CA, client
certificate and key, as kubeadm and cloud providers write them) leaves no file behind,
even in a process that ends as Spark's Python workers do (os._exit, no atexit).

The API server here is a TLS server that demands the client certificate and answers the
one PChannel list the discovery asks for.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.spark.helpers import assign

NAMESPACE = "spark-jobs"
LIST_PATH = f"/apis/streamwal.io/v1alpha1/namespaces/{NAMESPACE}/pchannels"

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


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def issue(name: str, cn: str, pki: Path, ext: str = "") -> None:
    """A P-256 key and a certificate for it signed by the test CA."""
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={cn}",
        cwd=pki,
    )
    (pki / f"{name}.ext").write_text(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
            cwd=pki)  # fmt: skip


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    pki = tmp_path / "pki"
    pki.mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca",
            cwd=pki)  # fmt: skip
    issue("server", "127.0.0.1", pki, "subjectAltName=IP:127.0.0.1\n")
    issue("client", "spark-job", pki, "extendedKeyUsage=clientAuth\n")
    return pki


class ApiServer:
    """HTTPS on loopback that requires a client certificate signed by the test CA."""

    def __init__(self, pki: Path, items: list[dict]) -> None:
        self.client_names: list[str] = []
        seen = self.client_names

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                subject = dict(x[0] for x in self.connection.getpeercert()["subject"])
                seen.append(subject["commonName"])
                if self.path.split("?")[0] != LIST_PATH:
                    self.send_error(404)
                    return
                body = json.dumps({"apiVersion": "streamwal.io/v1alpha1",
                                   "kind": "PChannelList", "items": items}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "server.crt", pki / "server.key")
        context.load_verify_locations(pki / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api_server(pki: Path, start_node) -> Iterator[tuple[ApiServer, str]]:
    node = start_node("n1")
    assign(node.address, 1, "kc-0")
    status = {"state": "Assigned", "term": 1, "node": {"id": 1, "address": node.address}}
    item = {"metadata": {"name": "kc-0"}, "status": status}
    server = ApiServer(pki, [item])
    yield server, node.address
    server.close()


def inline_kubeconfig(path: Path, pki: Path, server: str) -> Path:
    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": data("ca.crt")}}],
        "users": [{"name": "spark", "user": {
            "client-certificate-data": data("client.crt"), "client-key-data": data("client.key")}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "spark"}}],
    }))  # fmt: skip
    return path


def test_inline_credentials_leave_no_file_in_a_worker_that_exits_hard(api_server, pki, tmp_path):
    server, node_address = api_server
    kubeconfig = inline_kubeconfig(tmp_path / "kubeconfig", pki, server.url)
    private_tmp = tmp_path / "worker-tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(kubeconfig), NAMESPACE],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"kc-0": [node_address, 1]}
    assert server.client_names and set(server.client_names) == {"spark-job"}  # mutual TLS
    assert sorted(p.name for p in private_tmp.rglob("*")) == []  # no PEM file, no key left
