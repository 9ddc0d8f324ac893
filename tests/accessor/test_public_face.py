"""The client's public face is one face per style (issue 18's must-show, checked by
reading the code and the docs, no process started):

- one `AppendResult`, one `SyncTxn`, and `connect` defined once per face
  (`streamwal.client.connect`, `streamwal.client.aio.connect`);
- the README and docs/api.md lead with the same entry point, and no example reaches for
  another (the node tier's program in the README's "A node by hand" is the advanced one);
- no protobuf type in a signature of what the faces export (but in the conversions);
- every fenced example of the README and docs/api.md is run by a test.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import streamwal.client as blocking
from streamwal.client import aio
from streamwal.client.sync_accessor import SyncWALAccessor

ROOT = Path(__file__).resolve().parents[2]
# The one place each type meets the wire (DeliverPolicy's for the consumer's header,
# StreamingError's for gRPC's trailers): protobuf there is what they are for.
CONVERSIONS = {"to_proto", "from_proto"}
PARTS = ("common", "node", "coord", "operator", "client", "spark", "bench", "testing")


def _sources() -> dict[Path, str]:
    return {
        path: path.read_text()
        for part in PARTS
        for path in (ROOT / part).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def _defined(pattern: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path, text in _sources().items()
        for _ in re.finditer(pattern, text, re.MULTILINE)
    )


def test_one_append_result_one_sync_txn_one_connect_per_face() -> None:
    assert _defined(r"^class AppendResult\b") == ["client/append.py"]
    assert _defined(r"^class SyncTxn\b") == ["client/sync_accessor.py"]
    assert _defined(r"^(async )?def connect\(") == ["client/__init__.py", "client/aio.py"]


def _python_blocks(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_the_readme_and_the_api_page_use_the_same_entry_point() -> None:
    faces = r"from streamwal\.client(\.aio)? import [^\n]*\bconnect\b"
    for doc in ("README.md", "docs/api.md"):
        blocks = [b for b in _python_blocks(doc) if "pyspark" not in b]
        assert re.search(faces, blocks[0]), f"{doc} does not lead with streamwal.client"
        for block in blocks:
            if "NodeClient(" in block:  # the node tier, shown as such in the README only
                assert doc == "README.md"
                continue
            assert re.search(faces, block), f"{doc}: an example without connect:\n{block}"
            assert not re.search(r"streamwal\.client\.(wal|sync|routing|node_client)\b", block)


def _public_callables():
    exported = [getattr(aio, name) for name in aio.__all__]
    classes = [obj for obj in exported if inspect.isclass(obj)] + [SyncWALAccessor]
    yield from (obj for obj in exported if inspect.isfunction(obj))
    yield blocking.connect
    for cls in classes:
        yield cls
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if (not name.startswith("_") or name == "__init__") and name not in CONVERSIONS:
                yield member


def test_no_protobuf_type_in_a_public_signature() -> None:
    leaks = []
    for obj in _public_callables():
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):  # builtins without one
            continue
        if re.search(r"\b\w*pb\.|_pb2\b", signature):
            leaks.append(f"{obj.__qualname__}{signature}")
    assert not leaks, "\n".join(leaks)


# The README's one block no test runs as written: it is the set-up itself. CI runs
# `scripts/test` (.ci/run); `scripts/demo` is `scripts/setup` then `streamwal dev`, which
# tests/routing/test_failover.py runs (setting up again would cost the suite ~40 s).
SET_UP_BLOCK = "scripts/demo    # set up, then run the embedded cluster demo and print its summary"


def test_every_example_of_the_readme_and_the_api_page_is_run_by_a_test() -> None:
    """Each README block sits between markers `<!-- NAME: begin (TEST_FILE ...) -->` and
    `<!-- NAME: end -->`, and TEST_FILE reads them (`readme_blocks`); docs/api.md's blocks are all
    python (tests/accessor/test_api_docs.py runs every one)."""
    text = (ROOT / "README.md").read_text()
    covered = []
    for name, test_file, body in re.findall(
        r"<!-- ([\w-]+): begin \((tests/\S+\.py)[^)]*\) -->\n(.*?)<!-- \1: end -->", text, re.DOTALL
    ):
        assert f'readme_blocks("{name}")' in (ROOT / test_file).read_text(), (name, test_file)
        covered += re.findall(r"^```\w+\n(.*?)^```", body, re.MULTILINE | re.DOTALL)
    blocks = re.findall(r"^```\w+\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    uncovered = [b for b in blocks if b not in covered]
    assert [b.splitlines()[0] for b in uncovered] == [SET_UP_BLOCK], uncovered
    api = (ROOT / "docs" / "api.md").read_text()
    kinds = re.findall(r"^```(\w+)\n", api, re.MULTILINE)
    assert kinds and set(kinds) == {"python"}, kinds
