"""Throw-away certificates for tests, made with the openssl command line (P-256 keys: fast).

The control plane (tests/control_plane.py) and the TLS tests of the chart get their CA,
server and client certificates here; nothing is kept beyond the test's directory.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str = "ca", cn: str = "streamwal-test-ca") -> KeyPair:
    """A self-signed CA certificate and its key in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "3650", "-subj", f"/CN={cn}",
        "-keyout", str(pair.key), "-out", str(pair.cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )  # fmt: skip
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    subject: str,
    sans: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by `ca`; `subject` like ``/CN=x`` or ``/O=g/CN=x``;
    `sans` like ``IP:127.0.0.1`` or ``DNS:localhost``."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
    ext = directory / f"{name}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if sans:
        lines.append(f"subjectAltName={','.join(sans)}")
    ext.write_text("\n".join(lines) + "\n")
    csr = directory / f"{name}.csr"
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", subject, "-keyout", str(pair.key), "-out", str(csr),
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(pair.cert),
        cwd=directory,
    )  # fmt: skip
    return pair


def make_signing_key(directory: Path, name: str = "sa") -> KeyPair:
    """A bare key pair (`cert` holds the public key): the service-account token signer."""
    pair = KeyPair(directory / f"{name}.pub", directory / f"{name}.key")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", str(pair.key), cwd=directory)  # fmt: skip
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert), cwd=directory)
    return pair
