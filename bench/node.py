"""`streamwal bench node`: one node, one client, the numbers issue 2 sets targets for.

It starts a real node process, then measures: acknowledged produce throughput of one
pipelined client (128-byte payloads by default), one-at-a-time produce latency (on the
settled node over the produce port and over gRPC, and again right after the throughput
run while RocksDB digests it),
catch-up consume throughput from the start of the log, and the time a killed node with
a large log on disk needs to serve again (spawn -> produce acknowledged -> consumed).
Progress goes to stderr; the last stdout line is one JSON object.

With `--replicas N` (odd, > 1) N node processes hold the pchannel: node 1 leads, the
others follow it, and the producer is acknowledged at QUORUM (stored and synced on a
majority). The run then also reports how long the followers need to catch up with the
leader once the throughput run ends (`followers_caught_up_s`); the restart measurement
is a single-node figure and is skipped.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

from streamwal.bench import stats
from streamwal.client import encoding
from streamwal.client.node_client import NodeClient, replica_set
from streamwal.client.policy import DeliverPolicy
from streamwal.testing.local_node import LocalNode

PCHANNEL = "bench-0"
BATCH = 4096  # messages per produce frame (about 0.5 MiB of 128-byte payloads) ...
FRAME_BYTES = 1024 * 1024  # ... or fewer: about this many payload bytes per frame at most
WARM_UP_BYTES = 40_000 * 128  # payload bytes of the warm-up (40,000 messages of 128 B)


def frame_messages(size: int) -> int:
    """Messages per produce frame of `size`-byte payloads: BATCH, fewer large ones (4096
    of 4 KiB would be a 16 MiB frame, over the node's default --max-frame-size)."""
    return stats.batch_size(size, BATCH, FRAME_BYTES)


async def warm_up(producer, size: int) -> None:
    """Connections, code paths, RocksDB's memtable: WARM_UP_BYTES of payloads."""
    per_frame = frame_messages(size)
    await fill(producer, max(per_frame, WARM_UP_BYTES // max(1, size)), size, per_frame, 8)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fill(producer, total: int, size: int, batch: int, in_flight: int, progress=None) -> float:
    """Append `total` payloads of `size` bytes, `in_flight` batches at once; returns seconds.

    Every message is encoded individually, as an application's would be.
    """
    payload = b"\x5a" * size
    started = time.perf_counter()
    pending: set[asyncio.Future] = set()
    sent = 0
    while sent < total:
        n = min(batch, total - sent)
        entries = [encoding.encode_entry(payload) for _ in range(n)]
        pending.add(asyncio.ensure_future(producer.send_batch(entries)))
        sent += n
        if len(pending) >= in_flight:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                f.result()
            if progress:
                progress.update(sent - progress.n)
    for f in asyncio.as_completed(pending):
        await f
    if progress:
        progress.update(sent - progress.n)
    return time.perf_counter() - started


async def one_at_a_time(producer, size: int, sends: int, desc: str) -> list[float]:
    """Milliseconds of each acknowledged send, the next sent only after the last acked."""
    from tqdm import tqdm

    lat = []
    payload = b"\x5a" * size
    for _ in tqdm(range(sends), desc=desc, file=sys.stderr):
        t = time.perf_counter()
        await producer.send(payload)
        lat.append((time.perf_counter() - t) * 1000)
    return lat


async def consume_all(nc: NodeClient, term: int, start: int, upto: int) -> tuple[int, float]:
    """Read [start, upto), touching every payload; (messages, seconds)."""
    consumer = await nc.consumer(
        PCHANNEL, term, DeliverPolicy.start_from(start), time_ticks=False, end_offset=upto
    )
    started = time.perf_counter()
    count = 0
    try:
        while True:  # a poll loop, as Kafka consumers run: a batch per call
            batch = await consumer.next_batch()
            if batch is None:
                break
            count += sum(len(p) > 0 for p in batch.payloads)
    finally:
        await consumer.close()
    return count, time.perf_counter() - started


def start_nodes(workdir: Path, replicas: int) -> list[LocalNode]:
    """`replicas` node processes (one directory each), started in turn."""
    nodes = []
    try:
        for i in range(1, replicas + 1):
            name = "node" if replicas == 1 else f"node{i}"
            nodes.append(
                LocalNode(workdir / name, node_id=i, extra_args=("--log-level", "warning")).start()
            )
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes


async def assign_replicas(nodes: list[LocalNode], term: int) -> None:
    """Node 1 leads `PCHANNEL` at `term`; the others follow it."""
    members = [(n.node_id, n.address) for n in nodes]
    for i, node in enumerate(nodes):
        async with NodeClient(node.address) as nc:
            rs = replica_set(i == 0, members, None if i == 0 else members[0])
            await nc.assign(PCHANNEL, term, replica_set=rs)


async def followers_caught_up(nc: NodeClient, followers: int, timeout: float = 120.0) -> float:
    """Seconds until the leader reports every follower at its log end (lag 0)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        status = (await nc.collect_status()).channels[0]
        if len(status.replicas) >= followers and all(p.lag == 0 for p in status.replicas):
            return time.perf_counter() - started
        await asyncio.sleep(0.01)
    raise TimeoutError(f"followers not caught up after {timeout}s")


async def run(
    quick: bool, size: int, messages: int, restart_messages: int, workdir: Path, replicas: int = 1
) -> dict:
    from tqdm import tqdm

    nodes = start_nodes(workdir, replicas)
    node = nodes[0]
    result: dict = {
        "payload_bytes": size,
        "durability": "sync (fsync per group commit)",
        "replicas": replicas,
        "ack_level": "quorum" if replicas > 1 else "leader",
    }
    try:
        async with NodeClient(node.address) as nc:
            if replicas > 1:
                await assign_replicas(nodes, 1)
            else:
                await nc.assign(PCHANNEL, 1)
            producer = await nc.producer(PCHANNEL, 1)
            await warm_up(producer, size)

            # One-at-a-time latency on a settled node: RocksDB is not yet digesting the
            # throughput run below (flushes and compactions of ~0.5 GB share the 2 cores;
            # that case is reported separately as produce_after_burst_*).
            # (quick: fewer one-at-a-time sends with replicas, each waits for a quorum)
            latency_sends = (2000 if replicas == 1 else 800) if quick else 20000
            lat = await one_at_a_time(producer, size, latency_sends, "latency")
            result["produce_p50_ms"] = round(statistics.median(lat), 3)
            result["produce_p99_ms"] = round(_percentile(lat, 0.99), 3)
            result["produce_p999_ms"] = round(_percentile(lat, 0.999), 3)
            result["produce_transport"] = producer.transport
            # The same over a gRPC Produce stream, for clients that cannot use the port.
            async with NodeClient(node.address, produce_port=False) as grpc_nc:
                grpc_producer = await grpc_nc.producer(PCHANNEL, 1)
                lat = await one_at_a_time(grpc_producer, size, latency_sends, "latency, gRPC")
                await grpc_producer.close()
            result["produce_grpc_p50_ms"] = round(statistics.median(lat), 3)
            result["produce_grpc_p99_ms"] = round(_percentile(lat, 0.99), 3)
            # Catch-up below reads the throughput run's records, not the latency run's
            # thousands of one-message records (a different workload, read slower).
            bulk_start = (await nc.collect_status()).channels[0].next_offset

            with tqdm(total=messages, desc="produce", unit="msg", file=sys.stderr) as bar:
                secs = await fill(producer, messages, size, frame_messages(size), 8, bar)
            result["produce_msgs"] = messages
            result["produce_msgs_per_s"] = round(messages / secs)
            result["produce_mb_per_s"] = round(messages * size / secs / 1e6, 1)
            if replicas > 1:
                waited = await followers_caught_up(nc, replicas - 1)
                result["followers_caught_up_s"] = round(waited, 3)

            # Catch-up: read back the produce run from disk.
            status = await nc.collect_status()
            end = status.channels[0].next_offset
            count, secs = await consume_all(nc, 1, bulk_start, end)
            result["consume_msgs"] = count
            result["consume_msgs_per_s"] = round(count / secs)

            lat = await one_at_a_time(producer, size, latency_sends, "latency after burst")
            result["produce_after_burst_p50_ms"] = round(statistics.median(lat), 3)
            result["produce_after_burst_p99_ms"] = round(_percentile(lat, 0.99), 3)

            if replicas > 1:
                await producer.close()
                return result
            have = (await nc.collect_status()).channels[0].next_offset
            if restart_messages > have:
                with tqdm(
                    total=restart_messages - have,
                    desc="fill for restart",
                    unit="msg",
                    file=sys.stderr,
                ) as bar:
                    more = restart_messages - have
                    await fill(producer, more, size, frame_messages(size), 8, bar)
            await producer.close()
            status = await nc.collect_status()
            result["restart_messages_on_disk"] = status.channels[0].next_offset
    finally:
        for n in nodes:
            n.kill()

    started = time.perf_counter()
    node.start()
    try:
        async with NodeClient(node.address) as nc:
            await nc.assign(PCHANNEL, 1)  # idempotent: same term
            producer = await nc.producer(PCHANNEL, 1)
            r = await producer.send(b"after-restart")
            consumer = await nc.consumer(PCHANNEL, 1, DeliverPolicy.start_from(r.offset))
            first = await consumer.__anext__()
            assert first.payload == b"after-restart"
            result["restart_s"] = round(time.perf_counter() - started, 3)
            await consumer.close()
            await producer.close()
    finally:
        node.kill()
    return result


@click.command("node")
@click.option("--quick", is_flag=True, help="A short run (< 30 s) for smoke checks.")
@click.option(
    "--size",
    default=128,
    show_default=True,
    type=click.IntRange(min=1),
    help="Payload bytes (a produce frame holds 4096 messages, or about 1 MiB of larger ones).",
)
@click.option("--messages", default=None, type=int, help="Messages for the produce run.")
@click.option(
    "--restart-messages", default=None, type=int, help="Messages on disk before the restart."
)
@click.option(
    "--workdir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the node keeps data, in a temp dir made inside it (created if missing; "
    "default: the system's temp dir).",
)
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(1, 9),
    help="Node processes holding the pchannel (odd); > 1: acknowledged at QUORUM.",
)
def node(
    quick: bool,
    size: int,
    messages: int | None,
    restart_messages: int | None,
    workdir: str | None,
    replicas: int,
) -> None:
    """Benchmark one node: produce throughput and latency, consume, restart time."""
    if replicas % 2 == 0:
        raise click.BadParameter("must be odd (1, 3, 5, 7 or 9)", param_hint="--replicas")
    messages = messages or (300_000 if quick else 2_000_000)
    restart_messages = restart_messages or (1_000_000 if quick else 10_000_000)
    import uvloop  # the client's loop, as `streamwal produce` and `bench compare` run it

    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamwal-bench-", dir=workdir) as tmp:
        result = uvloop.run(run(quick, size, messages, restart_messages, Path(tmp), replicas))
    click.echo(json.dumps(result))
