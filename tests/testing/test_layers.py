"""The import contracts: the project keeps them, and each kind of breach is caught (on a
small made-up project, so the real one is not touched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamwal.testing import layers

PYPROJECT = """
[tool.setuptools.package-dir]
"streamwal" = "common"
"streamwal.node" = "node"
"streamwal.coord" = "coord"
"streamwal.operator" = "operator"
"streamwal.testing" = "testing"

[tool.streamwal.imports]
independent = ["streamwal.node", "streamwal.coord"]
layers = ["streamwal.operator", "streamwal.coord"]
harness = ["streamwal.testing"]
pure = ["streamwal.node.rules"]
pure_forbidden = ["asyncio", "grpc"]
allow = ["streamwal.coord.tolerated -> streamwal.node.io"]
"""

FILES = {
    "common/__init__.py": "",
    "common/errors.py": "import json\n",
    "node/rules.py": "from streamwal.errors import json\nfrom streamwal.node import io\n",
    "node/io.py": "import asyncio\n",
    "node/typed.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpc\n"
        "from streamwal.coord.view import View\n"
    ),
    "coord/view.py": "from . import plan\n",
    "coord/plan.py": "import streamwal.operator.hooks\n",
    "coord/tolerated.py": "from streamwal.node.io import x\n",
    "coord/harnessed.py": "from streamwal.testing.sim import run\n",
    "operator/hooks.py": "from streamwal.coord import view\n",
    "testing/sim.py": "from streamwal.node import io\nfrom streamwal.coord import plan\n",
}


def test_the_project_keeps_its_contracts() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamwal.testing.layers"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_every_kind_of_breach_is_reported_with_its_chain(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    modules, contracts = layers.load(tmp_path)
    problems = layers.check(modules, contracts)
    assert "pure: streamwal.node.rules -> streamwal.node.io -> asyncio" in problems
    # node -> coord through a chain (relative import included); TYPE_CHECKING skipped
    assert (
        "independence: streamwal.node.typed -> streamwal.coord.view -> streamwal.coord.plan"
        " -> streamwal.operator.hooks" not in problems
    )
    assert "independence: streamwal.node.typed -> streamwal.coord.view" in problems
    assert any(
        p.startswith("layers: streamwal.coord.plan -> streamwal.operator.hooks") for p in problems
    )
    assert any(
        p.startswith("harness: streamwal.coord.harnessed -> streamwal.testing.sim")
        for p in problems
    )
    assert not any("tolerated" in p for p in problems)  # allowed
    assert not any(p.startswith("harness: streamwal.testing") for p in problems)
    assert not any("grpc" in p for p in problems)
    # the harness import also makes a chain from coord into node
    assert (
        "independence: streamwal.coord.harnessed -> streamwal.testing.sim -> streamwal.node.io"
        in problems
    )
    assert len(problems) == 5, problems
