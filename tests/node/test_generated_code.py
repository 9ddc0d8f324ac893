"""The committed generated code is what `python proto/generate.py` makes from the .proto files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "proto"


def _generator():
    # proto/ is the package streamwal.proto; load the script by path, not as a module of it.
    spec = importlib.util.spec_from_file_location(
        "_streamwal_proto_generate", PROTO / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    fresh = {p.name: p.read_bytes() for p in written}
    committed = {p.name: p.read_bytes() for p in PROTO.glob("*_pb2*.py*")}
    assert fresh, "generate() wrote nothing"
    assert sorted(fresh) == sorted(committed), "generated and committed file sets differ"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated code, run `python proto/generate.py`: {stale}"
