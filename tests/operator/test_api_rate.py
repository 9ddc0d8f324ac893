"""The operator's load on the API server when a node with many PChannels fails.

What a platform engineer relies on: one node loss does not become a burst of requests
the API server's priority and fairness must refuse for everybody. The store's and
Events' requests keep `--kube-api-qps` / `--kube-api-burst` (the Lease's renewals, on a
thread of their own, do not count); Events are dropped rather than delay a status
write; and the failover still completes.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.operator.conftest import Cluster, OperatorProcess, pchannel_yaml, wait_for

QPS, BURST = 10, 5
NAMES = [f"rate-{i:02d}" for i in range(30)]


def _requests(op: OperatorProcess) -> dict[str, float]:
    """streamwal_operator_kube_requests_total by call, every outcome but "dropped"."""
    url = f"http://127.0.0.1:{op.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "streamwal_operator_kube_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["outcome"] != "dropped":
                    call = sample.labels["call"]
                    out[call] = out.get(call, 0.0) + sample.value
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_node_loss_keeps_the_request_rate_and_relists_little(cluster: Cluster) -> None:
    cluster.add_node(1)
    cluster.add_node(2)
    op = cluster.start_operator(
        "--kube-api-qps", str(QPS), "--kube-api-burst", str(BURST), "--resync", "30"
    )
    cluster.kubectl(
        "apply", "-f", "-", stdin=pchannel_yaml(*NAMES, failover={"allowDataLoss": True})
    )
    placed = {n: wait_for(lambda n=n: cluster.ready(n), 60, f"{n} Ready") for n in NAMES}
    victim = max((1, 2), key=lambda i: sum(o["status"]["node"]["id"] == i for o in placed.values()))
    survivor = 3 - victim
    moving = [n for n, o in placed.items() if o["status"]["node"]["id"] == victim]
    time.sleep(1.0)  # the placement's Events and refreshes settle
    before = _requests(op)

    started = time.monotonic()
    cluster.fail_node(victim)

    def all_moved() -> bool:
        return all(
            (obj := cluster.ready(n)) is not None and obj["status"]["node"]["id"] == survivor
            for n in moving
        )

    wait_for(all_moved, 90, f"the {len(moving)} PChannels of node {victim} on node {survivor}")
    took = time.monotonic() - started
    after = _requests(op)
    spent = {call: after[call] - before.get(call, 0.0) for call in after}
    total = sum(spent.values())
    print(f"{len(moving)} moved in {took:.1f}s, {total:.0f} requests: {spent}")

    # Each moved PChannel: two status writes (the new term, then assigned).
    assert spent.get("patch_namespaced_custom_object_status", 0) >= 2 * len(moving)
    # The rate held: no more than the burst plus what the rate allows in the window.
    assert total <= BURST + QPS * took, (total, took, spent)
