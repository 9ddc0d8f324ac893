"""Discovery through PChannel status on the real kube-apiserver, and failover.

Replication is not there yet, so the failover here is the one Kubernetes performs today:
the owner's pod dies (SIGKILL) and comes back with its volume at a NEW address, the
pchannel is assigned to it under a higher term, and PChannel status says so (written by
the test, as the operator will). Readers must notice (dead stream, then a stale
address), rediscover, and continue from the last delivered offset + 1: nothing lost,
nothing twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from streamwal.client.sync import SyncNodeClient
from streamwal.spark.offsets import Range
from streamwal.spark.options import parse_source
from streamwal.spark.reader import RangePartition, read_range
from tests.control_plane import ControlPlane
from tests.kube.conftest import pchannel_crd  # noqa: F401  (fixture)
from tests.spark.helpers import assign, produce, status

G, V, P = "streamwal.io", "v1alpha1", "pchannels"


class Kube:
    """PChannel objects in a namespace of the real API server, written as the operator
    would."""

    def __init__(self, cp: ControlPlane, tmp: Path) -> None:
        self.ns = cp.create_namespace()
        self.kubeconfig = cp.admin_kubeconfig(tmp / "kubeconfig", self.ns)
        self.api = cp.api(self.kubeconfig)
        self.objects = client.CustomObjectsApi(self.api)

    def pchannel(self, name: str, state: str, term: int, node_id: int, address: str) -> None:
        try:
            self.objects.create_namespaced_custom_object(
                G, V, self.ns, P, {"apiVersion": f"{G}/{V}", "kind": "PChannel",
                              "metadata": {"name": name}, "spec": {}}
            )  # fmt: skip
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
        status = {"state": state, "term": term, "node": {"id": node_id, "address": address}}
        self.objects.patch_namespaced_custom_object_status(
            G, V, self.ns, P, name, {"status": status}
        )


@pytest.fixture
def kube(kube_control_plane: ControlPlane, pchannel_crd: None, tmp_path: Path):  # noqa: F811
    k = Kube(kube_control_plane, tmp_path)
    yield k
    k.api.close()


def kube_options(kube: Kube, **extra: str) -> dict[str, str]:
    return {"kubernetes": kube.ns, "kubeconfig": str(kube.kubeconfig), **extra}


def test_batch_read_finds_owners_through_pchannel_status(spark, start_node, kube):
    a, b = start_node("a", node_id=1), start_node("b", node_id=2)
    assign(a.address, 3, "kd-0")
    assign(b.address, 1, "kd-1")
    assign(b.address, 1, "kd-2")  # served, but its status is not Assigned: not read
    kube.pchannel("kd-0", "Assigned", 3, 1, a.address)
    kube.pchannel("kd-1", "Assigned", 1, 2, b.address)
    kube.pchannel("kd-2", "Assigning", 2, 1, a.address)
    want = {("kd-0", o) for o in produce(a.address, "kd-0", 400, term=3)}
    want |= {("kd-1", o) for o in produce(b.address, "kd-1", 300)}
    produce(b.address, "kd-2", 10)
    reader = spark.read.format("streamwal").options(**kube_options(kube, pchannelPattern="kd-.*"))
    rows = reader.load().select("pchannel", "offset", "term").collect()
    assert {(r.pchannel, r.offset) for r in rows} == want and len(rows) == len(want)
    assert {r.term for r in rows if r.pchannel == "kd-0"} == {3}


def fail_over(start_node, old, kube: Kube, pchannel: str, name: str, term: int):
    """kill -9 the owner; restart it on its volume at a new address; assign; publish."""
    old.kill()
    new = start_node(name, node_id=2, data=old.data_dir)
    assign(new.address, term, pchannel)
    kube.pchannel(pchannel, "Assigned", term, 2, new.address)
    return new


def test_executor_read_follows_a_failover_mid_range(start_node, kube, caplog):
    a = start_node("a")
    assign(a.address, 1, "fo-0")
    kube.pchannel("fo-0", "Assigned", 1, 1, a.address)
    produced = produce(a.address, "fo-0", 20_000, batch=2000)
    # the range reaches past what the first owner ever had: the read must fail over
    end = status(a.address)["fo-0"][1] + 10_000
    opts = parse_source(
        kube_options(kube, pchannels="fo-0", readTimeoutMs="2000", discoveryTimeoutMs="30000"),
        streaming=False,
    )
    batches = read_range(RangePartition(Range("fo-0", 0, end), a.address, 1), opts)
    got = list(next(batches).column("offset").to_pylist())
    new = fail_over(start_node, a, kube, "fo-0", "a2", 2)
    produced.update(produce(new.address, "fo-0", 20_000, term=2, batch=2000, prefix="n"))
    with caplog.at_level(logging.WARNING, logger="streamwal.spark.reader"):
        for batch in batches:
            got.extend(batch.column("offset").to_pylist())
    assert any("rediscovering" in r.getMessage() for r in caplog.records), "no failover seen"
    assert got == sorted(o for o in produced if o < end), "lost or repeated offsets"


def test_streaming_query_survives_an_owner_failover(spark, start_node, kube, tmp_path):
    a = start_node("a")
    assign(a.address, 1, "fs-0")
    kube.pchannel("fs-0", "Assigned", 1, 1, a.address)
    owner = {"address": a.address, "term": 1}
    acked: dict[int, bytes] = {}
    stop = threading.Event()

    def producer() -> None:  # keeps appending, following the owner like a client would
        i = 0
        while not stop.is_set():
            try:
                with SyncNodeClient(owner["address"]) as c, c.producer("fs-0", owner["term"]) as p:
                    while not stop.is_set():
                        payloads = [f"x{i + k}".encode() for k in range(200)]
                        for r, v in zip(p.send_many(payloads), payloads, strict=True):
                            acked[r.offset] = v
                        i += 200
                        time.sleep(0.02)
            except Exception:
                time.sleep(0.1)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (
        spark.readStream.format("streamwal")
        .options(
            **kube_options(kube, pchannels="fs-0", startingOffsets="earliest", readTimeoutMs="3000")
        )
        .load()
        .select("offset", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while len([p for p in query.recentProgress if p["numInputRows"]]) < 2:
            assert time.monotonic() < deadline and query.exception() is None
            time.sleep(0.2)
        new = fail_over(start_node, a, kube, "fs-0", "a2", 2)
        owner.update(address=new.address, term=2)
        seen = len(acked)
        while len(acked) < seen + 2000:  # the producer resumed on the new owner
            assert time.monotonic() < deadline + 30
            time.sleep(0.1)
        stop.set()
        thread.join(10)
        log_end = status(new.address)["fs-0"][1]
        while True:  # wait until the query has caught up with the log end
            progress = query.lastProgress
            ends = progress and progress["sources"][0]["endOffset"]
            if isinstance(ends, str):
                ends = json.loads(ends)
            if ends and int(ends["fs-0"]) >= log_end:
                break
            assert time.monotonic() < deadline + 90 and query.exception() is None
            time.sleep(0.2)
    finally:
        stop.set()
        query.stop()
    rows = spark.read.parquet(str(out)).collect()
    offsets = [r.offset for r in rows]
    assert len(offsets) == len(set(offsets)), "a message was read twice"
    # every acknowledged message is there, with its payload; so is anything else in the log
    # (a send cut by the kill may have been appended without its acknowledgement)
    got = {r.offset: r.payload for r in rows}
    assert {o: got.get(o) for o in acked} == acked
    with SyncNodeClient(new.address) as c:
        in_log = {m.offset for m in c.consumer("fs-0", 2, end_offset=log_end, time_ticks=False)}
    assert set(got) == in_log
