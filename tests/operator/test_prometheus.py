"""A real Prometheus scrapes a streaming node and the operator's coord metrics on
loopback, and the metrics come back through its HTTP API: what dashboards and the chart's
alerts (streamwal_pchannel_info, streamwal_pchannel_term) are built on."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from streamwal.testing.local_node import LocalNode, free_port
from tests.operator.conftest import Cluster, pchannel_yaml, wait_for

PROMETHEUS = shutil.which("prometheus")


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.load(resp)["data"]["result"]
    except OSError:
        return []


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (scripts/setup --test)")
def test_prometheus_scrapes_node_and_operator(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.add_node(1)
    cluster.nodes[1].kill()  # restart the node with a metrics endpoint on its own address
    node_metrics = free_port("127.0.0.2")
    node = LocalNode(
        node.data_dir,
        node_id=1,
        host="127.0.0.2",
        port=node.port,
        extra_args=("--metrics", f"127.0.0.2:{node_metrics}"),
    ).start()
    cluster.nodes[1] = node
    op = cluster.start_operator()
    cluster.kubectl("apply", "-f", "-", stdin=pchannel_yaml("ch-prom"))
    wait_for(lambda: cluster.ready("ch-prom"), 30)

    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "streamwal-node",
                "static_configs": [{"targets": [f"127.0.0.2:{node_metrics}"]}],
            },
            {
                "job_name": "streamwal-operator",
                "static_configs": [{"targets": [f"127.0.0.1:{op.metrics_port}"]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("wb")
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def scraped_term_is_the_status_term() -> bool:
            # The term the resource shows now: under CI load the operator's 1 s grace
            # may fail the lone node over between ready and the scrape (a new term).
            served = query(port, 'streamwal_pchannel_term{pchannel="ch-prom"}')
            now = cluster.ready("ch-prom")
            return bool(served and now) and float(served[0]["value"][1]) == now["status"]["term"]

        wait_for(scraped_term_is_the_status_term, 45, "node term scraped, the status's")
        info = wait_for(
            lambda: query(port, 'streamwal_pchannel_info{pchannel="ch-prom"} == 1'),
            30,
            "operator pchannel info scraped",
        )
        assert info[0]["metric"]["job"] == "streamwal-operator"
        assert info[0]["metric"].get("state") == "assigned", info
        # spec.replicas, what the under-replicated alert compares the serving nodes with
        wanted = query(port, 'streamwal_pchannel_replicas_wanted{pchannel="ch-prom"}')
        assert [float(w["value"][1]) for w in wanted] == [1.0]
        up = query(port, "up")
        assert {r["metric"]["job"]: r["value"][1] for r in up} == {
            "streamwal-node": "1",
            "streamwal-operator": "1",
        }
    finally:
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
