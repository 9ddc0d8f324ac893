"""A real Kubernetes control plane for the tests: etcd and kube-apiserver on loopback.

The binaries come from the directory named by ``KUBEBUILDER_ASSETS`` (envtest's
convention: ``kube-apiserver``, ``etcd`` and ``kubectl`` side by side), or, when the
variable is unset, from ``.venv/kubebuilder-assets``, where ``scripts/setup --test``
unpacks the project's pinned control plane. There is no kubelet, scheduler or
controller-manager: objects are stored, validated, defaulted, admitted and watched by the
real API server and nothing runs them, so tests create Pods and write their status
themselves, create each namespace's ``default`` ServiceAccount (the ServiceAccount
admission plugin refuses Pods without it), and never see a namespace finish deleting.

One control plane serves a whole test session (the ``kube_control_plane`` fixture of
tests/conftest.py); tests keep apart by namespace. Start-up takes a few seconds: a
throw-away PKI (openssl), etcd without fsync, kube-apiserver with RBAC.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.pki import KeyPair, issue, make_ca, make_signing_key

ROOT = Path(__file__).resolve().parents[1]
ASSETS_ENV = "KUBEBUILDER_ASSETS"
DEFAULT_ASSETS = ROOT / ".venv" / "kubebuilder-assets"


def assets_dir() -> Path:
    """Where kube-apiserver, etcd and kubectl are: $KUBEBUILDER_ASSETS, else the setup cache."""
    return Path(os.environ.get(ASSETS_ENV) or DEFAULT_ASSETS)


def binary_version(path: Path) -> str:
    """`kube-apiserver --version` -> 'v1.36.2' (first line, last word)."""
    out = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=20, check=True
    ).stdout
    return out.splitlines()[0].split()[-1]


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_kubeconfig(
    path: Path, server: str, ca: Path, user: dict[str, str], namespace: str = "default"
) -> Path:
    """A one-context kubeconfig; `user` is e.g. {"token": ...} or client certificate paths."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server,
                                                  "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user",
                                                  "namespace": namespace}}],
        "current-context": "test",
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd + kube-apiserver in `workdir`; `admin` is a system:masters client certificate."""

    def __init__(self, assets: Path, workdir: Path) -> None:
        self.assets = assets
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.server = ""
        self.version = ""
        self.etcd_version = ""
        self.started_in = 0.0
        self.ca: KeyPair | None = None
        self.admin: KeyPair | None = None
        self.kubeconfig = workdir / "admin.kubeconfig"

    def binary(self, name: str) -> Path:
        path = self.assets / name
        if not os.access(path, os.X_OK):
            raise RuntimeError(
                f"{path} is missing: run scripts/setup --test, or point {ASSETS_ENV} at a "
                "directory holding kube-apiserver, etcd and kubectl (setup-envtest use)"
            )
        return path

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 90.0) -> ControlPlane:
        started = time.monotonic()
        etcd_bin, apiserver_bin = self.binary("etcd"), self.binary("kube-apiserver")
        pki = self.workdir / "pki"
        self.ca = make_ca(pki)
        names = ("IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc")
        serving = issue(self.ca, pki, "apiserver", "/CN=kube-apiserver", names, server=True)
        self.admin = issue(self.ca, pki, "admin", "/O=system:masters/CN=admin", client=True)
        signer = make_signing_key(pki)
        etcd_port, peer_port, api_port = free_ports(3)
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            str(etcd_bin), "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--initial-cluster-state", "new",
            "--unsafe-no-fsync",  # a test cluster: speed over crash safety
        ])  # fmt: skip
        self._wait(lambda: b'"health":"true"' in self._get(f"{etcd_url}/health"), timeout, "etcd")
        audience = "https://kubernetes.default.svc.cluster.local"
        # This kube-apiserver (built from OpenShift's tree) posts lifecycle Events into the
        # namespace of the pod named by POD_NAMESPACE/POD_NAME; kube-system keeps the
        # namespaces tests use free of them, as with an upstream apiserver.
        env = {**os.environ, "POD_NAMESPACE": "kube-system", "POD_NAME": "kube-apiserver"}
        self._spawn("kube-apiserver", [
            str(apiserver_bin), "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(api_port), "--cert-dir", str(self.workdir / "apiserver-certs"),
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(self.ca.cert), "--authorization-mode", "RBAC",
            "--service-account-issuer", audience, "--api-audiences", audience,
            "--service-account-key-file", str(signer.cert),
            "--service-account-signing-key-file", str(signer.key),
            "--service-cluster-ip-range", "10.0.0.0/24", "--endpoint-reconciler-type", "none",
            "--allow-privileged=true", "--profiling=false", "--v", "1",
        ], env=env)  # fmt: skip
        self.server = f"https://127.0.0.1:{api_port}"
        self._wait(lambda: self._get(f"{self.server}/readyz") == b"ok", timeout, "kube-apiserver")
        write_kubeconfig(self.kubeconfig, self.server, self.ca.cert,
                         {"client-certificate": str(self.admin.cert),
                          "client-key": str(self.admin.key)})  # fmt: skip
        self.version = json.loads(self._get(f"{self.server}/version"))["gitVersion"]
        self.etcd_version = json.loads(self._get(f"{etcd_url}/version"))["etcdserver"]
        self.create_namespace("default")
        self.started_in = time.monotonic() - started
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the API server first, then etcd
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)

    def _get(self, url: str) -> bytes:
        context = None
        if url.startswith("https"):
            assert self.ca is not None and self.admin is not None
            context = ssl.create_default_context(cafile=str(self.ca.cert))
            context.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                return resp.read()
        except OSError:
            return b""

    def _wait(self, check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for proc in self.procs:
                if proc.poll() is not None:
                    log = (self.workdir / f"{proc.name}.log").read_text(errors="replace")  # type: ignore[attr-defined]
                    raise RuntimeError(f"{proc.name} exited ({proc.returncode}):\n{log[-3000:]}")  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout}s (logs in {self.workdir})")
            time.sleep(0.1)

    # ------------------------------------------------------------------ clients

    def api(self, kubeconfig: Path | None = None):  # -> kubernetes.client.ApiClient
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def admin_kubeconfig(self, path: Path, namespace: str) -> Path:
        """The admin's kubeconfig with `namespace` as the current context's namespace."""
        assert self.ca is not None and self.admin is not None
        user = {"client-certificate": str(self.admin.cert), "client-key": str(self.admin.key)}
        return write_kubeconfig(path, self.server, self.ca.cert, user, namespace)

    def create_namespace(self, name: str | None = None) -> str:
        """A namespace with its `default` ServiceAccount (what the controller-manager adds)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        api = self.api()
        try:
            core = client.CoreV1Api(api)
            for create in (
                lambda: core.create_namespace({"metadata": {"name": name}}),
                lambda: core.create_namespaced_service_account(
                    name, {"metadata": {"name": "default"}}
                ),
            ):
                try:
                    create()
                except ApiException as err:
                    if err.status != 409:
                        raise
        finally:
            api.close()
        return name

    def service_account_kubeconfig(
        self, path: Path, namespace: str, account: str, hours: int = 2
    ) -> Path:
        """A kubeconfig authenticating as the ServiceAccount (a TokenRequest token), as a
        pod running under it would."""
        from kubernetes import client

        assert self.ca is not None
        api = self.api()
        try:
            token = (
                client.CoreV1Api(api)
                .create_namespaced_service_account_token(
                    account, namespace, {"spec": {"expirationSeconds": hours * 3600}}
                )
                .status.token
            )
        finally:
            api.close()
        return write_kubeconfig(path, self.server, self.ca.cert, {"token": token}, namespace)
