"""`streamwal demo`: one local node, a produce/consume workload, a kill -9, a summary.

It is the smallest end-to-end tour: producers append with acknowledgements, the node is
killed with SIGKILL mid-stream and restarted on the same data, and every acknowledged
message is read back and checked (present, once, in order, at its acknowledged offset).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import click

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import StreamingError
from streamwal.node.local import LocalNode


async def _produce(nc: NodeClient, pchannel: str, total: int, acked: dict, bar) -> None:
    producer = await nc.producer(pchannel, 1)
    try:
        for start in range(0, total, 500):
            payloads = [f"{pchannel}:{i}".encode() for i in range(start, min(total, start + 500))]
            results = await producer.send_many(payloads, vchannel=f"{pchannel}_v0")
            for p, r in zip(payloads, results, strict=True):
                acked[r.offset] = p
            bar.update(len(payloads))
    except StreamingError:
        pass  # the node was killed mid-batch: what was acknowledged is in `acked`
    finally:
        await producer.close()


async def _verify(nc: NodeClient, pchannel: str, acked: dict[int, bytes]) -> dict:
    status = {s.pchannel.name: s for s in (await nc.collect_status()).channels}
    end = status[pchannel].next_offset
    consumer = await nc.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False, end_offset=end)
    seen: dict[int, bytes] = {}
    try:
        async for m in consumer:
            if m.offset in seen:
                raise AssertionError(f"offset {m.offset} delivered twice")
            seen[m.offset] = m.payload
    finally:
        await consumer.close()
    missing = [o for o, p in acked.items() if seen.get(o) != p]
    return {"acknowledged": len(acked), "read_back": len(seen), "missing_or_changed": len(missing)}


async def run(workdir: Path, messages: int, pchannels: int) -> dict:
    from tqdm import tqdm

    names = [f"demo-{i}" for i in range(pchannels)]
    node = LocalNode(workdir / "node-1", extra_args=("--log-level", "warning")).start()
    click.echo(f"node 1 serving on {node.address} (data in {node.data_dir})", err=True)
    acked: dict[str, dict[int, bytes]] = {n: {} for n in names}
    summary: dict = {"pchannels": names, "messages_per_pchannel": messages}
    try:
        async with NodeClient(node.address) as nc:
            for n in names:
                await nc.assign(n, 1)
            with tqdm(
                total=messages * pchannels, unit="msg", desc="produce", file=sys.stderr
            ) as bar:
                started = time.perf_counter()
                producing = [
                    asyncio.ensure_future(_produce(nc, n, messages, acked[n], bar)) for n in names
                ]
                while bar.n < messages * pchannels // 2:
                    await asyncio.sleep(0.01)
                node.kill()
                click.echo("\nkilled the node with SIGKILL mid-stream", err=True)
                await asyncio.gather(*producing)
                summary["produce_seconds"] = round(time.perf_counter() - started, 3)
    finally:
        node.kill()
    started = time.perf_counter()
    node.start()
    summary["restart_seconds"] = round(time.perf_counter() - started, 3)
    click.echo(f"restarted node 1 in {summary['restart_seconds']} s", err=True)
    try:
        async with NodeClient(node.address) as nc:
            for n in names:  # a restarted node serves a pchannel again once re-assigned
                await nc.assign(n, 1)
            summary["verify"] = {n: await _verify(nc, n, acked[n]) for n in names}
    finally:
        node.stop()
    summary["ok"] = all(v["missing_or_changed"] == 0 for v in summary["verify"].values())
    return summary


@click.command("demo")
@click.option("--messages", default=200_000, show_default=True, help="Messages per pchannel.")
@click.option("--pchannels", default=2, show_default=True)
@click.option("--workdir", default=None, type=click.Path(file_okay=False), help="Keep data here.")
def demo(messages: int, pchannels: int, workdir: str | None) -> None:
    """Run a local node, produce, kill -9 it mid-stream, restart, verify every ack."""
    with tempfile.TemporaryDirectory(prefix="streamwal-demo-", dir=workdir) as tmp:
        summary = asyncio.run(run(Path(tmp), messages, pchannels))
    for name, v in summary["verify"].items():
        click.echo(
            f"{name}: {v['acknowledged']} acknowledged, {v['read_back']} read back, "
            f"{v['missing_or_changed']} missing"
        )
    click.echo(json.dumps(summary))
    if not summary["ok"]:
        raise SystemExit(1)
