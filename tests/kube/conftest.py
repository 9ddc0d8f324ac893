"""Fixtures for the Kubernetes tests: the API emulator, and the real kubectl / helm / promtool.

kubectl and helm are the static binaries ``scripts/kube-tools`` puts in ``.venv/bin``
(never whatever kubectl is on the PATH). Every kubectl run gets its own kubeconfig,
HOME and a fresh discovery cache, so no run sees state of another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the emulator is imported as tests.kube.emulator
    sys.path.insert(0, str(ROOT))

from tests.kube.emulator import KubeEmulator  # noqa: E402

BIN = ROOT / ".venv" / "bin"
CRD_FILE = ROOT / "crds" / "pchannels.streamwal.io.yaml"
CHART = ROOT / "helm" / "streamwal"


@pytest.fixture(scope="session")
def kube_bin() -> Path:
    """The directory holding the pinned helm and kubectl (installed on first use)."""
    subprocess.run([str(ROOT / "scripts" / "kube-tools")], check=True, timeout=300)
    return BIN


@pytest.fixture
def emulator() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emu:
        yield emu


@dataclass
class Kubectl:
    """Runs the real kubectl against one emulator."""

    binary: Path
    env: dict[str, str]

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        # A cold discovery cache each run: kubectl's disk cache would otherwise hide a CRD
        # registered since the previous run from short-name expansion (kubectl explain pch).
        shutil.rmtree(self.env["KUBECACHEDIR"], ignore_errors=True)
        proc = subprocess.run(
            [str(self.binary), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc


@pytest.fixture
def kubectl(emulator: KubeEmulator, kube_bin: Path, tmp_path: Path) -> Kubectl:
    home = tmp_path / "kubectl-home"
    home.mkdir()
    config = emulator.kubeconfig(home / "config")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "KUBECONFIG": str(config),
        "KUBECACHEDIR": str(home / "cache"),
    }
    return Kubectl(kube_bin / "kubectl", env)


@pytest.fixture
def kubeconfig(emulator: KubeEmulator, tmp_path: Path) -> Path:
    return emulator.kubeconfig(tmp_path / "kubeconfig")
