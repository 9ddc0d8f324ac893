"""Security on (mutual TLS and an access file), with certificates made here (tests/pki.py):
three nodes and a coord on loopback, each with its own certificate and the access file.

What users rely on: the coord and the peer nodes work (an RF=3 pchannel replicates); a
client identity cannot Assign, Remove, Fence, Fetch, Drain or Destroy; a producer allowed
the prefix `a-` cannot produce to `b-1`; a consumer cannot produce; and a node or coord
with a broken access file refuses to start with one line and exit status 2.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from click.testing import CliRunner

from streamwal import transport
from streamwal.cli import main
from streamwal.client import Message
from streamwal.client.aio import connect
from streamwal.client.node_client import NodeClient
from streamwal.errors import PermissionDenied, StreamingError
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_cluster import LocalCluster
from streamwal.transport import TransportConfig
from tests.pki import KeyPair, issue, make_ca
from tests.support import wait_for

SERVER_NAME = "streamwal-test"
ACCESS = """
identities:
  - names: [wal-node, wal-coord]
    roles: [cluster]
  - names: [app-a]
    roles: {producer: ["a-*"], consumer: ["a-*"]}
  - names: [reader]
    roles: {consumer: ["*"]}
  - names: [ops]
    roles: [admin]
"""
DENIED = "PERMISSION_DENIED"


@dataclass
class Secured:
    cluster: LocalCluster
    ca: KeyPair
    certs: dict[str, KeyPair]
    access_file: Path

    def env(self, who: str) -> dict[str, str]:
        pair = self.certs[who]
        return {
            "STREAMWAL_TLS_CA": str(self.ca.cert),
            "STREAMWAL_TLS_CERT": str(pair.cert),
            "STREAMWAL_TLS_KEY": str(pair.key),
            "STREAMWAL_TLS_SERVER_NAME": SERVER_NAME,
        }

    def transport(self, who: str) -> TransportConfig:
        pair = self.certs[who]
        return TransportConfig(str(pair.cert), str(pair.key), str(self.ca.cert), SERVER_NAME)

    def coord_stub(self, who: str) -> tuple[object, cpbg.StreamingCoordChannelServiceStub]:
        channel = transport.make_channel(self.cluster.coord_address, self.transport(who))
        return channel, cpbg.StreamingCoordChannelServiceStub(channel)


def _pki(root: Path) -> tuple[KeyPair, dict[str, KeyPair]]:
    ca = make_ca(root)
    san = (f"DNS:{SERVER_NAME}",)
    certs = {
        "wal-node": issue(ca, root, "node", "/CN=wal-node", san, True, True),
        "wal-coord": issue(ca, root, "coord", "/CN=wal-coord", san, True, True),
        **{n: issue(ca, root, n, f"/CN={n}", client=True) for n in ("app-a", "reader", "ops")},
    }
    return ca, certs


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyPair, dict[str, KeyPair]]:
    return _pki(tmp_path_factory.mktemp("pki"))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def secured(
    tmp_path_factory: pytest.TempPathFactory, pki: tuple[KeyPair, dict[str, KeyPair]]
) -> AsyncIterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    ca, certs = pki
    access_file = root / "access.yaml"
    access_file.write_text(ACCESS)
    sec = Secured(None, ca, certs, access_file)  # type: ignore[arg-type]
    sec.cluster = LocalCluster(
        root / "cluster",
        nodes=3,
        coord_args=("--access-file", str(access_file)),
        node_args=("--access-file", str(access_file)),
        node_env=sec.env("wal-node"),
        transport=sec.transport("ops"),
    )
    try:
        await asyncio.gather(*(sec.cluster.start_node(i) for i in sec.cluster.node_ids))
        await sec.cluster.start_coord(env=sec.env("wal-coord"))
        yield sec
    finally:
        await sec.cluster.close()


async def _create(sec: Secured, prefix: str, replicas: int) -> str:
    channel, stub = sec.coord_stub("ops")
    async with channel:  # type: ignore[attr-defined]
        answer = await stub.CreateChannels(
            cpb.CreateChannelsRequest(num_channels=1, prefix=prefix, replicas=replicas), timeout=10
        )
    return answer.channel_names[0]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_coord_and_peers_work_and_a_replicated_pchannel_replicates(
    secured: Secured,
) -> None:
    name = await _create(secured, "a-log", 3)
    async with await connect(
        coord=secured.cluster.coord_address, transport=secured.transport("app-a")
    ) as wal:
        sent = [await wal.raw_append(Message(f"{name}_v1", f"m{i}".encode())) for i in range(10)]
    end = sent[-1].message_id + 1
    channel, stub = secured.coord_stub("ops")
    async with channel:  # type: ignore[attr-defined]
        (desc,) = (
            await stub.DescribeChannels(cpb.DescribeChannelsRequest(channel_names=[name]))
        ).descriptions
    assert len(desc.members) == 3
    # Every replica comes to hold the records (a QUORUM ack waits for a majority only):
    # each node's status, asked with the cluster role.
    for node in secured.cluster.nodes.values():
        async with NodeClient(node.address, secured.transport("wal-coord")) as client:

            async def holds(client: NodeClient = client) -> bool:
                status = await client.collect_status()
                (mine,) = [c for c in status.channels if c.pchannel.name == name]
                return mine.next_offset >= end

            await wait_for(holds, 10.0, what=f"node {node.node_id} holds offsets below {end}")


async def _append(sec: Secured, who: str, vchannel: str, payload: bytes) -> None:
    async with await connect(coord=sec.cluster.coord_address, transport=sec.transport(who)) as wal:
        await wal.raw_append(Message(vchannel, payload))


@pytest.mark.asyncio(loop_scope="module")
async def test_a_client_identity_cannot_manage_replicate_drain_or_destroy(
    secured: Secured,
) -> None:
    name = await _create(secured, "a-managed", 1)
    await _append(secured, "app-a", f"{name}_v1", b"first")
    channel, stub = secured.coord_stub("app-a")
    async with channel:  # type: ignore[attr-defined]
        (desc,) = (
            await stub.DescribeChannels(cpb.DescribeChannelsRequest(channel_names=[name]))
        ).descriptions
        owner = secured.cluster.nodes[desc.meta.node.server_id]
        term = desc.meta.channel.term
        async with NodeClient(owner.address, secured.transport("app-a")) as client:
            for call in (
                client.assign(name, term + 1),
                client.remove(name, term),
                client.fence(name, term + 5),
            ):
                with pytest.raises(StreamingError, match=DENIED):
                    await call
        internal = await transport.internal_address(owner.address, secured.transport("app-a"))
        async with transport.make_channel(internal, secured.transport("app-a")) as node:
            fetch = node.unary_stream(
                "/milvus.proto.streaming.StreamingNodeReplicationService/Fetch",
                request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=pb.FetchResponse.FromString,
            )
            with pytest.raises(Exception, match=DENIED):
                async for _ in fetch(pb.FetchRequest(pchannel=name), timeout=10):
                    pass
        with pytest.raises(Exception, match=DENIED):
            await stub.DrainNode(cpb.DrainNodeRequest(server_id=owner.node_id), timeout=10)
        with pytest.raises(Exception, match=DENIED):
            await stub.DestroyChannels(cpb.DestroyChannelsRequest(channel_names=[name]))
        (after,) = (
            await stub.DescribeChannels(cpb.DescribeChannelsRequest(channel_names=[name]))
        ).descriptions
    # Nothing moved: same owner, same term; the owner was not fenced, app-a still appends.
    assert (after.meta.node.server_id, after.meta.channel.term) == (owner.node_id, term)
    await _append(secured, "app-a", f"{name}_v1", b"still mine")


@pytest.mark.asyncio(loop_scope="module")
async def test_producers_are_held_to_their_pchannels_and_consumers_cannot_produce(
    secured: Secured,
) -> None:
    node = next(iter(secured.cluster.nodes.values()))
    async with NodeClient(node.address, secured.transport("app-a")) as client:
        with pytest.raises(StreamingError, match=f"{DENIED}.* on b-1"):
            producer = await client.producer("b-1", 1)
            await producer.send(b"not yours")
    name = await _create(secured, "a-read", 1)
    started = time.monotonic()
    with pytest.raises(PermissionDenied, match=DENIED):
        await _append(secured, "reader", f"{name}_v1", b"a reader")
    assert time.monotonic() - started < 10  # final: not retried as an outage would be


@pytest.mark.asyncio(loop_scope="module")
async def test_consumer_groups_need_the_consumer_role_and_the_produce_port_is_closed(
    secured: Secured,
) -> None:
    name = await _create(secured, "a-groups", 1)
    await _append(secured, "app-a", f"{name}_v1", b"m")
    channel, stub = secured.coord_stub("ops")
    async with channel:  # type: ignore[attr-defined]
        (desc,) = (
            await stub.DescribeChannels(cpb.DescribeChannelsRequest(channel_names=[name]))
        ).descriptions
    owner = secured.cluster.nodes[desc.meta.node.server_id]
    term = desc.meta.channel.term
    async with NodeClient(owner.address, secured.transport("ops")) as admin:
        with pytest.raises(StreamingError, match=f"{DENIED}.* on {name}"):
            await admin.create_consumer_group(name, term, "g")
        # No transport escapes the checks: the plain-TCP produce and replication ports are
        # closed under TLS (followers replicate over gRPC on the internal listener).
        described = await admin.describe()
        assert (described.produce_port, described.replication_port) == (0, 0)
    async with NodeClient(owner.address, secured.transport("app-a")) as app:
        await app.create_consumer_group(name, term, "g")
        got = await app.group_consume(name, term, "g", 10)
        assert b"m" in [m.payload for m in got]


def _tls_env(pki: tuple[KeyPair, dict[str, KeyPair]]) -> dict[str, str]:
    ca, certs = pki
    return {
        "STREAMWAL_TLS_CA": str(ca.cert),
        "STREAMWAL_TLS_CERT": str(certs["wal-node"].cert),
        "STREAMWAL_TLS_KEY": str(certs["wal-node"].key),
    }


def _command(part: str, root: Path) -> list[str]:
    return {
        "node": ["node", "--data-dir", str(root / "d"), "--listen", "127.0.0.1:0"],
        "coord": ["coord", "--meta-dir", str(root / "m"), "--nodes", "1=127.0.0.1:1"],
        "operator": ["operator", "--coord-listen", "127.0.0.1:0"],
    }[part]


@pytest.mark.parametrize("part", ["node", "coord"])
def test_a_broken_access_file_refuses_to_start(
    tmp_path: Path, part: str, pki: tuple[KeyPair, dict[str, KeyPair]]
) -> None:
    """As a user runs it: one line, exit status 2, nothing served."""
    path = tmp_path / "access.yaml"
    path.write_text("identities: [{names: [x], roles: [writer]}]")
    proc = subprocess.run(
        [sys.executable, "-m", "streamwal", *_command(part, tmp_path), "--access-file", str(path)],
        env={**_tls_env(pki), "PATH": ""}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: Invalid value for --access-file: {path}: identities[0].roles: "
        "unknown role 'writer' (one of cluster, producer, consumer, admin)"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("part", ["node", "coord", "operator"])
@pytest.mark.parametrize(
    ("content", "tls", "message"),
    [
        ("identities: [", True, "not valid YAML/JSON"),
        (None, True, "No such file"),
        ("identities: [{names: [a], roles: {producer: ['a*b']}}]", True, "prefix ending in *"),
        # mTLS without rules: every certificate of the CA could fence; rules without
        # mTLS: no identity to check them against.
        ("", True, "needs an --access-file"),
        (ACCESS, False, "--access-file needs mutual TLS"),
    ],
)
def test_misconfigured_security_is_one_line_and_exit_status_2(
    tmp_path: Path,
    part: str,
    content: str | None,
    tls: bool,
    message: str,
    pki: tuple[KeyPair, dict[str, KeyPair]],
) -> None:
    path = tmp_path / "access.yaml"
    extra = ["--access-file", str(path)] if content != "" else []
    if content:
        path.write_text(content)
    env = _tls_env(pki) if tls else {}
    result = CliRunner().invoke(main, [*_command(part, tmp_path), *extra], env=env)
    assert result.exit_code == 2, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert message in error, result.output
