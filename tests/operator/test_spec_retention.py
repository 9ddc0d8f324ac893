"""spec.retention acts on every replica, on the real API server: the nodes apply the
PChannel's policy (their CollectStatus and metrics say so), status.retention shows it, a
change of the spec changes it on the live pchannel and cuts what is now too old, and
"forever" is a policy too."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc

from streamwal.client.node_client import NodeClient
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg
from streamwal.testing.local_node import free_port
from tests.operator.conftest import Cluster, pchannel_yaml, wait_for


def _statuses(address: str, name: str) -> pb.PChannelStatus | None:
    with grpc.insecure_channel(address) as ch:
        stub = pbg.StreamingNodeManagerServiceStub(ch)
        resp = stub.CollectStatus(pb.StreamingNodeManagerCollectStatusRequest(), timeout=2)
    return next((c for c in resp.channels if c.pchannel.name == name), None)


def _metric(url: str, family: str, name: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    line = next(
        (x for x in text.splitlines() if x.startswith(f'{family}{{pchannel="{name}"}}')), ""
    )
    return float(line.split()[-1]) if line else None


async def _produce(address: str, name: str, term: int, count: int) -> None:
    async with NodeClient(address) as c:
        producer = await c.producer(name, term)
        await producer.send_many([b"x" * 100 for _ in range(count)])
        await producer.close()


def test_spec_retention_is_applied_on_every_replica_and_follows_the_spec(
    cluster: Cluster,
) -> None:
    metrics = {}
    for i in (1, 2, 3):
        host = f"127.0.0.{i + 1}"
        metrics[i] = f"http://{host}:{(port := free_port(host))}/metrics"
        cluster.add_node(
            i, extra_args=("--metrics", f"{host}:{port}", "--retention-check-interval", "200ms")
        )
    cluster.start_operator()
    spec = {"replicas": 3, "retention": {"age": "1h", "size": "10GB"}}
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-ret", **spec))

    def applied(age: str) -> dict | None:
        obj = cluster.ready("ch-ret")
        status = (obj or {}).get("status") or {}
        return status if (status.get("retention") or {}).get("age") == age else None

    status = wait_for(lambda: applied("1h"), 30, "retention 1h in status")
    assert status["retention"] == {
        "age": "1h",
        "size": "10GB",
        "maxAgeMs": 3_600_000,
        "maxBytes": 10_000_000_000,
    }
    for node in cluster.nodes.values():  # every replica, leader and followers
        policy = _statuses(node.address, "ch-ret").retention
        assert (policy.max_age_ms, policy.max_bytes) == (3_600_000, 10_000_000_000)
    for url in metrics.values():
        assert _metric(url, "streamwal_pchannel_retention_age_seconds", "ch-ret") == 3600
        assert _metric(url, "streamwal_pchannel_retention_bytes", "ch-ret") == 1e10

    leader = cluster.nodes[status["node"]["id"]]
    asyncio.run(_produce(leader.address, "ch-ret", status["term"], 200))
    assert _statuses(leader.address, "ch-ret").first_offset == 0

    # A change of the spec acts on the live pchannel: records older than 1 s are cut
    # from every replica (the newest record always stays).
    body = json.dumps({"spec": {"retention": {"age": "1s", "size": None}}})
    cluster.kubectl("patch", "pch", "ch-ret", "--type=merge", "-p", body)
    status = wait_for(lambda: applied("1s"), 30, "retention 1s in status")
    assert status["retention"]["size"] == "unlimited" and status["term"] >= 1

    def cut_everywhere() -> bool:
        return all(_statuses(n.address, "ch-ret").first_offset > 0 for n in cluster.nodes.values())

    wait_for(cut_everywhere, 20, "old records cut on every replica")

    # "forever": no age bound at all.
    body = json.dumps({"spec": {"retention": {"age": "forever"}}})
    cluster.kubectl("patch", "pch", "ch-ret", "--type=merge", "-p", body)
    wait_for(lambda: applied("forever"), 30, "retention forever in status")
    for url in metrics.values():
        assert _metric(url, "streamwal_pchannel_retention_age_seconds", "ch-ret") == 0
    assert not cluster.forbidden()
