"""A client generated only from the seed's streaming.proto works against the node.

The seed's file (tests/node/seed_streaming.proto, plus a minimal seed_milvus.proto) is
compiled with grpc_tools.protoc into a temporary folder and driven by seed_client.py in a
separate process. The descriptor test proves every seed declaration exists unchanged in
proto/streaming.proto, so compatibility does not hang on the messages the client happens
to use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.testing.local_node import LocalNode
from tests.node.conftest import StartNode
from tests.node.helpers import read_data

HERE = Path(__file__).resolve().parent
PROTO = HERE.parents[1] / "proto"
INCLUDE = Path(grpc_tools.__file__).resolve().parent / "_proto"


def _seed_sources(tmp: Path) -> Path:
    """The seed files under their import names (streaming.proto imports "milvus.proto")."""
    src = tmp / "seed_src"
    src.mkdir()
    shutil.copy(HERE / "seed_streaming.proto", src / "streaming.proto")
    shutil.copy(HERE / "seed_milvus.proto", src / "milvus.proto")
    return src


def _protoc(*args: str) -> None:
    assert protoc.main(["protoc", f"-I{INCLUDE}", *args]) == 0, f"protoc failed: {args}"


@pytest.fixture
def seed_code(tmp_path: Path) -> Path:
    src = _seed_sources(tmp_path)
    out = tmp_path / "seedpb"  # its own folder: never on the path of the test process
    out.mkdir()
    _protoc(
        f"-I{src}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(src / "streaming.proto"),
        str(src / "milvus.proto"),
    )
    return out


async def test_seed_client_produces_and_consumes(seed_code: Path, start_node: StartNode) -> None:
    """The seed's client plays the coord too (Assign on the node's one address): a node
    run with --internal-listen shared serves the manager services there, as the seed's."""
    node = start_node("n1", "--internal-listen=shared")
    async with NodeClient(node.address) as client:
        await _seed_round(seed_code, node, client)


async def _seed_round(seed_code: Path, node: LocalNode, client: NodeClient) -> None:
    count = 25
    proc = subprocess.run(
        [sys.executable, str(HERE / "seed_client.py"), str(seed_code), node.address, "seed", "25"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["streamwal_imported"] == []
    assert seen["producer_id"] > 0
    offsets = seen["offsets"]
    assert offsets == sorted(offsets) and len(set(offsets)) == count
    consumed = seen["consumed"]
    assert [m["payload"] for m in consumed] == [f"seed-{i}" for i in range(count)]
    assert [m["offset"] for m in consumed] == offsets
    for i, m in enumerate(consumed):
        assert m["properties"]["user"] == str(i)
        assert m["properties"]["_vc"] == f"seed_v{i % 2}"
        assert int(m["properties"]["_tt"]) > 0
    ticks = [int(m["properties"]["_tt"]) for m in consumed]
    assert ticks == sorted(ticks) and len(set(ticks)) == count
    assert seen["consumer_closed"] is True
    assert seen["state"] == {"node_id": 1, "role": "streamingnode", "state_code": "Healthy"}

    # What the seed client wrote is what a streamwal client reads.
    consumer = await client.consumer("seed", 1, DeliverPolicy.all())
    got = await read_data(consumer, count)
    await consumer.close()
    assert [m.offset for m in got] == offsets
    assert [m.payload for m in got] == [f"seed-{i}".encode() for i in range(count)]
    assert got[3].properties["user"] == "3" and got[3].vchannel == "seed_v1"


# -- descriptor level --------------------------------------------------------------------


def _descriptors(
    tmp: Path, include: Path, files: list[str]
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = tmp / f"{include.name}.pb"
    _protoc(
        f"-I{include}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        *(str(include / f) for f in files),
    )
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return {f.name: f for f in fds.file}


def _messages(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}

    def walk(prefix: str, msgs) -> None:
        for m in msgs:
            name = f"{prefix}.{m.name}"
            found[name] = m
            walk(name, m.nested_type)

    walk(fd.package, fd.message_type)
    return found


def _field_shape(msg: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto):
    oneof = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
    return (f.number, f.type, f.label, f.type_name, oneof)


@pytest.mark.parametrize(
    ("seed_name", "ours_name"),
    [("streaming.proto", "streaming.proto"), ("milvus.proto", "milvus.proto")],
)
def test_every_seed_declaration_exists_unchanged(
    tmp_path: Path, seed_name: str, ours_name: str
) -> None:
    seed = _descriptors(tmp_path, _seed_sources(tmp_path), ["streaming.proto"])[seed_name]
    ours = _descriptors(tmp_path, PROTO, ["streaming.proto"])[ours_name]
    assert seed.package == ours.package
    assert seed.options.go_package == ours.options.go_package

    seed_msgs, our_msgs = _messages(seed), _messages(ours)
    assert seed_msgs, "no messages parsed from the seed"
    for name, msg in seed_msgs.items():
        assert name in our_msgs, f"message {name} is missing"
        mine = {f.name: f for f in our_msgs[name].field}
        for f in msg.field:
            assert f.name in mine, f"field {name}.{f.name} is missing"
            assert _field_shape(our_msgs[name], mine[f.name]) == _field_shape(msg, f), (
                f"field {name}.{f.name} changed"
            )
        seed_numbers = {f.number for f in msg.field}
        for f in our_msgs[name].field:  # additions may not reuse a seed number
            if f.name not in {s.name for s in msg.field}:
                assert f.number not in seed_numbers, f"{name}.{f.name} reuses a seed number"

    our_enums = {e.name: e for e in ours.enum_type}
    for enum in seed.enum_type:
        assert enum.name in our_enums, f"enum {enum.name} is missing"
        values = {v.name: v.number for v in our_enums[enum.name].value}
        for v in enum.value:
            assert values.get(v.name) == v.number, f"enum value {enum.name}.{v.name} changed"

    our_services = {s.name: s for s in ours.service}
    for svc in seed.service:
        assert svc.name in our_services, f"service {svc.name} is missing"
        methods = {m.name: m for m in our_services[svc.name].method}
        for m in svc.method:
            assert m.name in methods, f"rpc {svc.name}.{m.name} is missing"
            theirs = methods[m.name]
            shape = (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            assert shape == (
                theirs.input_type,
                theirs.output_type,
                theirs.client_streaming,
                theirs.server_streaming,
            ), f"rpc {svc.name}.{m.name} changed"
