"""Regenerate the Python code for the wire contract: `python proto/generate.py`.

protoc writes `import milvus_pb2`, which only works with `proto/` itself on sys.path;
the files live in the `streamwal.proto` package, so imports are rewritten to be relative.
The staleness test calls `generate()` into a temporary folder and compares the output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
SOURCES = (
    "milvus.proto",
    "streaming.proto",
    "coord.proto",
    "broadcast.proto",
    "groups.proto",
    "wire.proto",
)
_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every source into `out_dir`."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(PROTO_DIR / s) for s in SOURCES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = []
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        text = path.read_text()
        fixed = _IMPORT.sub(r"from . import \1 as \2", text)
        if fixed != text:
            path.write_text(fixed)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR):
        print(p)
