"""`streamwal bench node` as scripts run it: a real node process, the JSON contract.

Not a timed test: the figures are checked for being there and plausible, never against
the targets (those are read off the benchmark's output on a quiet machine).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = (
    "produce_msgs_per_s",
    "produce_p50_ms",
    "produce_p99_ms",
    "produce_p999_ms",
    "produce_after_burst_p99_ms",
    "consume_msgs_per_s",
    "restart_s",
)
STREAMWAL = str(Path(sys.executable).with_name("streamwal"))


def last_json(*argv: str, timeout: float = 110) -> dict:
    """Run a benchmark command; the JSON object its last stdout line holds."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_bench_node_prints_one_json_object_last(tmp_path: Path) -> None:
    result = last_json(
        STREAMWAL, "bench", "node", "--quick", "--messages", "40000",
        "--restart-messages", "120000", "--workdir", str(tmp_path),
    )  # fmt: skip
    for key in KEYS:
        assert result[key] > 0, key
    assert result["produce_p50_ms"] <= result["produce_p99_ms"] <= result["produce_p999_ms"]
    assert result["restart_messages_on_disk"] >= 120_000
    # catch-up reads back the throughput run
    assert result["consume_msgs"] == 40_000
    assert "fsync" in result["durability"]
    # one-at-a-time latency over the produce port (the client's choice) and over gRPC
    assert result["produce_transport"] == "produce port"
    assert 0 < result["produce_grpc_p50_ms"] <= result["produce_grpc_p99_ms"]


@pytest.mark.timeout(120)
def test_bench_node_with_three_replicas_acknowledges_at_quorum(tmp_path: Path) -> None:
    result = last_json(
        STREAMWAL, "bench", "node", "--quick", "--replicas", "3", "--messages", "20000",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert result["replicas"] == 3 and result["ack_level"] == "quorum"
    for key in ("produce_msgs_per_s", "produce_p99_ms", "consume_msgs_per_s"):
        assert result[key] > 0, key
    assert result["followers_caught_up_s"] >= 0 and "restart_s" not in result


def test_append_cpu_prints_the_cpu_per_append_as_json() -> None:
    """The in-process CPU-per-append measure (docs/benchmarks.md): runs on this tree's Wal."""
    result = last_json(
        sys.executable, "-m", "streamwal.bench.append_cpu", "--appends", "200", "--repeat", "2"
    )
    assert set(result) == {"plain_cpu_us_per_append", "producer_cpu_us_per_append"}
    assert all(0 < v < 10_000 for v in result.values()), result


@pytest.mark.timeout(120)
def test_node_cpu_prints_each_phases_cpu_per_message_as_json() -> None:
    """The node-and-client CPU-per-message measure (docs/benchmarks.md): a real node, with
    4 KiB payloads (bench node's frames hold fewer of them: 4096 would be over the node's
    frame limit)."""
    result = last_json(
        sys.executable, "-m", "streamwal.bench.node_cpu", "--messages", "2048", "--sends", "20",
        "--size", "4096",
    )  # fmt: skip
    assert set(result) == {
        "one_at_a_time_us_per_send",
        "produce_ns_per_msg",
        "consume_ns_per_msg",
    }
    for phase in result.values():
        assert set(phase) == {"node", "node_loop", "client", "client_loop", "msgs_per_s"}
        # the node's threads include its event loop; this process includes its loop thread
        assert 0 < phase["node_loop"] <= phase["node"], result
        assert 0 < phase["client_loop"] <= phase["client"], result
        assert phase["msgs_per_s"] > 0


@pytest.mark.timeout(120)
def test_quorum_cpu_prints_each_processes_cpu_per_acknowledged_message_as_json() -> None:
    """The RF=3 CPU-per-message measure (docs/benchmarks.md, "Replicated path"): 3 nodes."""
    result = last_json(
        sys.executable, "-m", "streamwal.bench.quorum_cpu",
        "--messages", "4096", "--rounds", "2", "--producers", "1", "4",
        "--open-loop", "200", "--seconds", "0.3", "--also-follows",
    )  # fmt: skip
    assert result["replicas"] == 3 and "quorum" in result["durability"]
    assert result["leader_also_follows"] is True
    # one-at-a-time sends (compare's open loop): their tail and each process's CPU a send
    one = result["open_loop_200"]["median"]
    assert 0 < one["p50_ms"] <= one["p99_ms"], result
    assert all(one[f"{n}_ns"] > 0 for n in ("leader", "follower1", "follower2", "client"))
    for shape in ("x1", "x4"):
        assert len(result[shape]["rounds"]) == 2
        median = result[shape]["median"]
        for node in ("leader", "follower1", "follower2"):
            # every node works for each message; its threads include its event loop
            assert 0 < median[f"{node}_loop_ns"] <= median[f"{node}_ns"], result
        assert median["client_ns"] > 0 and median["msgs_per_s"] > 0
        for r in result[shape]["rounds"]:
            parts = ("leader_ns", "follower1_ns", "follower2_ns", "client_ns")
            assert r["total_ns"] == sum(r[k] for k in parts), r


async def test_a_stream_led_by_another_node_is_followed_by_node_1(tmp_path: Path) -> None:
    """`quorum_cpu --also-follows`: compare's system with a second stream that node 2
    leads, so that node 1 (the measured leader) also follows one."""
    from streamwal.bench.sys_streamwal import Streamwal
    from streamwal.proto import streaming_pb2 as pb

    system = Streamwal(replicas=3)
    await system.start(tmp_path)
    try:
        await system.create_stream("measured")
        await system.create_stream("followed", leader=1)
        assert system._admin is not None
        roles = {}
        for node, admin in enumerate(system._admin, start=1):
            for s in (await admin.collect_status()).channels:
                roles[(node, s.pchannel.name)] = s.role
        leader, follower = pb.REPLICA_ROLE_LEADER, pb.REPLICA_ROLE_FOLLOWER
        assert roles == {
            (1, "measured"): leader, (2, "measured"): follower, (3, "measured"): follower,
            (1, "followed"): follower, (2, "followed"): leader, (3, "followed"): follower,
        }  # fmt: skip
    finally:
        await system.stop()
