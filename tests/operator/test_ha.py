"""Two operators against the real API server, as the chart runs them (replicas: 2, one
Lease): only the leader acts; when it is killed the standby takes over within the lease
duration (15 s) of its last renewal, so within 15 s of the kill."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.operator.conftest import LEASE, Cluster, log_time, pchannel_yaml, wait_for


@pytest.mark.slow
def test_only_the_leader_acts_and_a_standby_takes_over_within_15_s(cluster: Cluster) -> None:
    cluster.add_node(1)
    cluster.add_node(2)
    first = cluster.start_operator()
    wait_for(lambda: log_time(first.text(), "leading"), 20, "a leader")
    second = cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-ha-1"))
    wait_for(lambda: cluster.ready("ch-ha-1"), 30, "ch-ha-1 Ready")
    assert '"pchannel assigned"' in first.text()
    # The standby watches (it serves AssignmentDiscover from a fresh view) but never writes.
    assert '"leading"' not in second.text() and '"pchannel assigned"' not in second.text()

    killed = time.time()
    first.kill()  # SIGKILL: no release; the Lease must expire
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-ha-2"))
    wait_for(lambda: cluster.ready("ch-ha-2"), 30, "ch-ha-2 Ready after the takeover")
    took_over = log_time(second.text(), "leading")
    assert took_over is not None and took_over - killed <= 15.0, took_over and took_over - killed
    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(LEASE, cluster.ns)
    assert lease.spec.lease_transitions == 1
    assert '"pchannel assigned"' in second.text()
    print(f"takeover {took_over - killed:.1f} s after the kill")
