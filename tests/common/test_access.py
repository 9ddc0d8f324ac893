"""The access rules (common/access.py): parsing refuses what it cannot read exactly, and
`allowed` answers as docs/security.md says. Pure: no processes."""

from __future__ import annotations

import pytest

from streamwal import access
from streamwal.access import METHODS, AccessError, parse
from streamwal.proto import (
    broadcast_pb2,
    coord_pb2,
    groups_pb2,
    streaming_pb2,
    wire_pb2,
)

RULES = parse(
    """
identities:
  - names: [wal-coord, wal-node]
    roles: [cluster]
  - names: [app-a]
    roles: {producer: ["a-*"], consumer: ["a-*", "shared"]}
  - names: [reader]
    roles: {consumer: ["*"]}
  - names: [ops]
    roles: [admin]
  - names: ["*"]
    roles: {consumer: ["public-*"]}
"""
)
NODE = "/milvus.proto.streaming.StreamingNode"
COORD = "/streamwal.coord.StreamingCoordChannelService/"


def m(name: str) -> access.Method:
    return METHODS[name]


@pytest.mark.parametrize(
    ("who", "method", "pchannels", "allowed"),
    [
        # The cluster role: everything.
        ("wal-coord", f"{NODE}ManagerService/Assign", [], True),
        ("wal-node", f"{NODE}ReplicationService/Fetch", [], True),
        ("wal-coord", f"{NODE}HandlerService/Produce", ["b-1"], True),
        ("wal-coord", f"{COORD}DestroyChannels", ["x"], True),
        # A client identity: no manager, replication, drain or destroy call.
        ("app-a", f"{NODE}ManagerService/Assign", [], False),
        ("app-a", f"{NODE}ManagerService/Remove", [], False),
        ("app-a", f"{NODE}ManagerService/CollectStatus", [], True),  # read-only: discovery
        ("app-a", f"{NODE}ReplicationService/Fence", [], False),
        ("app-a", f"{NODE}ReplicationService/Fetch", [], False),
        ("app-a", f"{NODE}ReplicationService/Replicate", [], False),
        ("app-a", f"{COORD}DrainNode", [], False),
        ("app-a", f"{COORD}DestroyChannels", ["a-1"], False),
        # Per pchannel: a prefix, an exact name, nothing else.
        ("app-a", f"{NODE}HandlerService/Produce", ["a-1"], True),
        ("app-a", f"{NODE}HandlerService/Produce", ["b-1"], False),
        ("app-a", f"{NODE}HandlerService/Produce", ["shared"], False),
        ("app-a", f"{NODE}HandlerService/Consume", ["shared"], True),
        ("app-a", f"{NODE}HandlerService/Consume", ["sharedx"], False),
        ("app-a", "/streamwal.groups.StreamingNodeConsumerGroupService/GroupSeek", ["a-2"], True),
        # A consumer cannot produce; a consumer-group call needs the consumer role.
        ("reader", f"{NODE}HandlerService/Produce", ["a-1"], False),
        ("reader", f"{NODE}HandlerService/Consume", ["b-1"], True),
        ("ops", "/streamwal.groups.StreamingNodeConsumerGroupService/GroupConsume", ["a"], False),
        # Admin: the coord's administrative calls, and no data.
        ("ops", f"{COORD}DestroyChannels", ["a-1", "b-1"], True),
        ("ops", f"{COORD}DrainNode", [], True),
        ("ops", f"{NODE}HandlerService/Consume", ["a-1"], False),
        # Any verified certificate ("*"): its own grants, health and discovery.
        ("stranger", f"{NODE}HandlerService/Consume", ["public-1"], True),
        ("stranger", f"{NODE}HandlerService/Consume", ["a-1"], False),
        ("stranger", "/grpc.health.v1.Health/Check", [], True),
        ("stranger", "/milvus.proto.streaming.StreamingCoordAssignmentService/AssignmentDiscover",
         [], True),
        # Several pchannels: every one must be granted.
        ("app-a", f"{COORD}DestroyChannels", ["a-1"], False),
        ("app-a", f"{NODE}HandlerService/Consume", ["a-1", "b-1"], False),
    ],
)  # fmt: skip
def test_allowed(who: str, method: str, pchannels: list[str], allowed: bool) -> None:
    assert RULES.allowed([who], m(method), pchannels) is allowed


def test_no_certificate_gets_nothing_not_even_health() -> None:
    assert not RULES.allowed([], m("/grpc.health.v1.Health/Check"), [])


def test_any_of_a_certificates_names_counts() -> None:
    produce = m(f"{NODE}HandlerService/Produce")
    assert RULES.allowed(["somebody", "app-a"], produce, ["a-9"])


def test_a_file_without_a_wildcard_denies_strangers_discovery() -> None:
    rules = parse("identities: [{names: [x], roles: [producer]}]")
    for method in (
        "/milvus.proto.streaming.StreamingCoordAssignmentService/AssignmentDiscover",
        f"{NODE}ManagerService/CollectStatus",
    ):
        assert rules.allowed(["x"], m(method), []) and not rules.allowed(["y"], m(method), [])


def test_every_served_method_has_a_rule() -> None:
    """A method without a rule is denied: every method of every service streamwal serves
    must be in METHODS (and nothing else), or a new RPC would be unusable under security."""
    served = {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
    for module in (streaming_pb2, coord_pb2, broadcast_pb2, groups_pb2, wire_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                served.add(f"/{service.full_name}/{method.name}")
    assert served == set(METHODS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected one key, identities"),
        ("identities: []", "non-empty list"),
        ("identities: [{names: [a], roles: [producr]}]", "unknown role 'producr'"),
        ("identities: [{names: [a], roles: {producer: []}}]", "non-empty list of pchannel"),
        ("identities: [{names: [a], roles: {producer: ['a*b']}}]", "prefix ending in *"),
        ("identities: [{names: [a], roles: {producer: 'a-*'}}]", "non-empty list of pchannel"),
        ("identities: [{names: [], roles: [admin]}]", "names: a non-empty list"),
        ("identities: [{names: [' a'], roles: [admin]}]", "not a certificate name"),
        ("identities: [{names: [a], roles: [admin], extra: 1}]", "keys names and roles"),
        ("identities: [{names: [a], roles: [admin]}, {names: [a], roles: [producer]}]",
         "listed twice"),
        ("identities: [{names: [a], roles: [admin]}]\nusers: []", "expected one key"),
        ("identities: [{names: [a], roles: [admin]", "not valid YAML/JSON"),
    ],
)  # fmt: skip
def test_a_broken_file_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(AccessError, match="^access file: .*" + message.replace("*", r"\*")) as e:
        parse(text)
    assert "\n" not in str(e.value)


def test_json_files_parse_too(tmp_path) -> None:
    path = tmp_path / "access.json"
    path.write_text('{"identities": [{"names": ["a"], "roles": {"producer": ["a-*"]}}]}')
    rules = access.load(str(path))
    assert rules.allowed(["a"], m(f"{NODE}HandlerService/Produce"), ["a-1"])


def test_a_missing_file_is_one_line(tmp_path) -> None:
    with pytest.raises(AccessError, match="No such file"):
        access.load(str(tmp_path / "nope.yaml"))


def test_docs_security_names_only_flags_and_variables_that_exist() -> None:
    """docs/security.md matches the commands: every --flag it names is an option of the
    node, the coord or the operator, every STREAMWAL_<PART>_<FLAG> variable is that
    command's flag, every STREAMWAL_TLS_* is read by the transport; and the security
    flags of each server are documented."""
    import re
    from pathlib import Path

    from streamwal.coord.cli import coord
    from streamwal.node.cli import node
    from streamwal.operator.cli import operator

    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    commands = {"NODE": node, "COORD": coord, "OPERATOR": operator}
    flags = {o for c in commands.values() for p in c.params for o in p.opts}
    assert set(re.findall(r"(--[a-z][a-z-]+)", text)) <= flags
    for part, flag in re.findall(r"STREAMWAL_(NODE|COORD|OPERATOR)_([A-Z_]+)", text):
        assert f"--{flag.lower().replace('_', '-')}" in {
            o for p in commands[part].params for o in p.opts
        }, (part, flag)
    transport_source = (Path(__file__).resolve().parents[2] / "common" / "transport.py").read_text()
    for var in re.findall(r"STREAMWAL_TLS_[A-Z_]+", text):
        assert f'"{var}"' in transport_source, var
    for needed in ("--access-file", "--internal-listen", "--coord-listen"):
        assert needed in text
