"""Who may do what: identities, roles and per-pchannel permissions (docs/security.md).

Pure decisions: `parse` reads an access file, `Access.allowed` answers one question, and
`METHODS` names what every gRPC method of the node and the coord is. The drivers
(common/transport.py's interceptor) take the identity from the caller's verified client
certificate and the pchannel from the request, and apply the answer.

An access file (YAML or JSON):

    identities:
      - names: [streamwal-coord, streamwal-node]   # a certificate's CN or a SAN
        roles: [cluster]                            # a list: every pchannel
      - names: [app-a]
        roles:                                      # a mapping: role -> pchannels
          producer: ["a-*"]                         # a prefix ends in *
          consumer: ["a-*", "shared"]               # else an exact name
      - names: [ops]
        roles: [admin]
      - names: ["*"]                                # any certificate the CA signed
        roles: {consumer: ["public-*"]}

Roles: `cluster` (the coord, the operator, peer nodes: every service, every pchannel),
`producer` (Produce), `consumer` (Consume, consumer groups), `admin` (the coord's
create, destroy, drain and data-loss calls). Any identity with a role may discover
(the coord's assignment stream, describe, list nodes); anyone with a verified
certificate may ask health, state and Describe. A node's CollectStatus (its pchannels
and their offsets, read-only) counts as discovery: clients ask it for a pchannel's end.
Everything else is denied: a method missing from `METHODS` too (fail closed).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import yaml

CLUSTER, PRODUCER, CONSUMER, ADMIN = "cluster", "producer", "consumer", "admin"
ROLES = (CLUSTER, PRODUCER, CONSUMER, ADMIN)
ANY = "*"


class AccessError(ValueError):
    """An access file that cannot be used as written; the message is one line."""


class Action(Enum):
    """What a call does, and the role it needs (None: any verified certificate)."""

    PUBLIC = None  # health, state, Describe
    DISCOVER = "any role"  # assignments, describe channels, list nodes
    CLUSTER = CLUSTER  # manager and replication services
    PRODUCE = PRODUCER
    CONSUME = CONSUMER
    ADMIN = ADMIN


@dataclass(frozen=True)
class Method:
    """A gRPC method: its action, and where its pchannels are named (`pchannels`):
    a request field ("pchannel", "pchannel.name", "channel_names", "channel_name"), the
    stream header ("header:create-producer-bin"), or "" for none."""

    action: Action
    pchannels: str = ""


_NODE = "/milvus.proto.streaming.StreamingNode"
_COORD = "/milvus.proto.streaming.StreamingCoord"
_GROUPS = "/streamwal.groups.StreamingNodeConsumerGroupService/"
_CHANNELS = "/streamwal.coord.StreamingCoordChannelService/"
_BROADCAST = "/streamwal.broadcast.StreamingCoordBroadcastService/"
METHODS: Mapping[str, Method] = {
    "/grpc.health.v1.Health/Check": Method(Action.PUBLIC),
    "/grpc.health.v1.Health/Watch": Method(Action.PUBLIC),
    "/streamwal.wire.StreamingNodeInfoService/Describe": Method(Action.PUBLIC),
    # The probe port's liveness ping (its own threads, no access interceptor): an id, the
    # wall clock and the loop's stall, as public as a health check.
    "/streamwal.wire.StreamingNodeProbeService/Ping": Method(Action.PUBLIC),
    f"{_NODE}StateService/GetComponentStates": Method(Action.PUBLIC),
    f"{_COORD}StateService/GetComponentStates": Method(Action.PUBLIC),
    f"{_NODE}HandlerService/Produce": Method(Action.PRODUCE, "header:create-producer-bin"),
    f"{_NODE}HandlerService/Consume": Method(Action.CONSUME, "header:create-consumer-bin"),
    f"{_GROUPS}CreateConsumerGroup": Method(Action.CONSUME, "pchannel.name"),
    f"{_GROUPS}DestroyConsumerGroup": Method(Action.CONSUME, "pchannel.name"),
    f"{_GROUPS}GroupConsume": Method(Action.CONSUME, "pchannel.name"),
    f"{_GROUPS}GroupSeek": Method(Action.CONSUME, "pchannel.name"),
    f"{_GROUPS}GroupCommit": Method(Action.CONSUME, "pchannel.name"),
    f"{_GROUPS}DescribeConsumerGroups": Method(Action.CONSUME, "pchannel.name"),
    f"{_NODE}ManagerService/Assign": Method(Action.CLUSTER),
    f"{_NODE}ManagerService/Remove": Method(Action.CLUSTER),
    f"{_NODE}ManagerService/CollectStatus": Method(Action.DISCOVER),
    f"{_NODE}ReplicationService/Fetch": Method(Action.CLUSTER),
    f"{_NODE}ReplicationService/Replicate": Method(Action.CLUSTER),
    f"{_NODE}ReplicationService/Fence": Method(Action.CLUSTER),
    f"{_NODE}BatchService/Fence": Method(Action.CLUSTER),
    f"{_NODE}BatchService/Assign": Method(Action.CLUSTER),
    f"{_NODE}BatchService/Remove": Method(Action.CLUSTER),
    f"{_COORD}AssignmentService/AssignmentDiscover": Method(Action.DISCOVER),
    f"{_CHANNELS}DescribeChannels": Method(Action.DISCOVER),
    f"{_CHANNELS}ListNodes": Method(Action.DISCOVER),
    f"{_CHANNELS}CreateChannels": Method(Action.ADMIN),
    f"{_CHANNELS}DestroyChannels": Method(Action.ADMIN, "channel_names"),
    f"{_CHANNELS}DrainNode": Method(Action.ADMIN),
    f"{_CHANNELS}AcceptDataLoss": Method(Action.ADMIN, "channel_name"),
    f"{_BROADCAST}Broadcast": Method(Action.PRODUCE),
    f"{_BROADCAST}Ack": Method(Action.CONSUME),
    f"{_BROADCAST}WaitResourceKey": Method(Action.CONSUME),
    f"{_BROADCAST}ListBroadcasts": Method(Action.DISCOVER),
}


@dataclass(frozen=True)
class Grant:
    """One role on some pchannels: exact names and prefixes (ANY: every pchannel)."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def covers(self, pchannel: str | None) -> bool:
        """Whether the grant reaches `pchannel`; None (a call naming no pchannel): any."""
        if pchannel is None:
            return bool(self.names or self.prefixes)
        return pchannel in self.names or any(pchannel.startswith(p) for p in self.prefixes)


@dataclass(frozen=True)
class Access:
    """Per identity name (ANY: every verified certificate), its grants by role."""

    grants: Mapping[str, Mapping[str, Grant]] = field(default_factory=dict)

    def roles(self, names: Iterable[str]) -> dict[str, list[Grant]]:
        found: dict[str, list[Grant]] = {}
        for name in (*names, ANY):
            for role, grant in self.grants.get(name, {}).items():
                found.setdefault(role, []).append(grant)
        return found

    def allowed(self, names: Collection[str], method: Method, pchannels: Iterable[str]) -> bool:
        """Whether a caller whose certificate carries `names` (CN and SANs; empty: none)
        may call `method` on `pchannels` (empty: a call naming none)."""
        if not names:
            return False
        action = method.action
        if action is Action.PUBLIC:
            return True
        roles = self.roles(names)
        if CLUSTER in roles:
            return True
        if action is Action.DISCOVER:
            return bool(roles)
        if action is Action.CLUSTER:
            return False
        grants = roles.get(action.value, [])
        wanted: list[str | None] = [*pchannels] or [None]
        return all(any(g.covers(p) for g in grants) for p in wanted)


def load(path: str) -> Access:
    """`parse` the file at `path`; AccessError (one line) when unreadable or wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise AccessError(f"{path}: {exc.strerror or exc}") from None
    return parse(text, path)


def parse(text: str, source: str = "access file") -> Access:
    """The Access a file's text declares. Anything unknown or malformed is refused with
    an AccessError naming the place: a file that says more or other than we read would
    grant what its author did not mean (fail closed)."""
    try:
        doc = yaml.safe_load(text) if not source.endswith(".json") else json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:
        mark = getattr(exc, "problem_mark", None)
        what = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise AccessError(f"{source}: not valid YAML/JSON{at}: {what}") from None
    where = source
    if not isinstance(doc, dict) or set(doc) != {"identities"}:
        raise AccessError(f"{where}: expected one key, identities (a list)")
    entries = doc["identities"]
    if not isinstance(entries, list) or not entries:
        raise AccessError(f"{where}: identities must be a non-empty list")
    grants: dict[str, dict[str, Grant]] = {}
    for i, entry in enumerate(entries):
        at = f"{where}: identities[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"names", "roles"}:
            raise AccessError(f"{at}: expected the keys names and roles")
        names = _names(entry["names"], at)
        roles = _roles(entry["roles"], at)
        for name in names:
            if name in grants:
                raise AccessError(f"{at}: identity {name!r} is listed twice")
            grants[name] = roles
    return Access(grants)


def _names(value: Any, at: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise AccessError(f"{at}.names: a non-empty list of certificate names")
    for name in value:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise AccessError(f"{at}.names: {name!r} is not a certificate name")
    return value


def _roles(value: Any, at: str) -> dict[str, Grant]:
    if isinstance(value, list):
        value = {role: [ANY] for role in value}
    if not isinstance(value, dict) or not value:
        raise AccessError(f"{at}.roles: a non-empty list of roles, or role: [pchannels]")
    out: dict[str, Grant] = {}
    for role, patterns in value.items():
        if role not in ROLES:
            raise AccessError(f"{at}.roles: unknown role {role!r} (one of {', '.join(ROLES)})")
        out[role] = _grant(patterns, f"{at}.roles.{role}")
    return out


def _grant(patterns: Any, at: str) -> Grant:
    if not isinstance(patterns, list) or not patterns:
        raise AccessError(f"{at}: a non-empty list of pchannel names or prefixes (a-*)")
    names: set[str] = set()
    prefixes: list[str] = []
    for p in patterns:
        if not isinstance(p, str) or not p or "*" in p[:-1] or p.strip() != p:
            raise AccessError(f"{at}: {p!r} is not a pchannel name or a prefix ending in *")
        if p.endswith("*"):
            prefixes.append(p[:-1])
        else:
            names.add(p)
    return Grant(frozenset(names), tuple(prefixes))
