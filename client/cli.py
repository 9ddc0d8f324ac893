"""`streamwal produce` and `streamwal consume`: the node client on the command line."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import click

from streamwal.cli import Address
from streamwal.client.policy import DeliverFilter, DeliverPolicy

NODE = click.option("--node", required=True, type=Address(), help="Node gRPC HOST:PORT.")
PCHANNEL = click.option("--pchannel", required=True)
TERM = click.IntRange(1, 2**63 - 1)
OFFSET = click.IntRange(0, 2**63 - 1)


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


@click.command("produce")
@NODE
@PCHANNEL
@click.option("--term", type=TERM, required=True, help="Term the pchannel is assigned under.")
@click.option("--assign", is_flag=True, help="Assign the pchannel to the node under --term first.")
@click.option("--vchannel", default=None, help="Set `_vc` on every message.")
@click.option(
    "--count",
    type=click.IntRange(1),
    default=None,
    help="Send COUNT synthetic messages instead of stdin lines.",
)
@click.option(
    "--size",
    type=click.IntRange(0, 1024**3),
    default=128,
    show_default=True,
    help="Synthetic payload bytes.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 1_000_000),
    default=1000,
    show_default=True,
    help="Messages per batch.",
)
@click.option(
    "--ack-level",
    type=click.Choice(["default", "leader", "quorum"]),
    default="default",
    show_default=True,
    help="Replicated pchannels: answer once synced on the leader, or on a quorum of replicas "
    "(default: quorum with several replicas).",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def produce(
    node, pchannel, term, assign, vchannel, count, size, batch, ack_level, progress
) -> None:
    """Append messages: stdin lines (one message each), or --count synthetic ones.

    Prints one JSON summary line: messages, first/last offset, seconds, msgs/s.
    """
    _run(_produce(node, pchannel, term, assign, vchannel, count, size, batch, ack_level, progress))


async def _produce(
    node, pchannel, term, assign, vchannel, count, size, batch, ack_level, progress
) -> None:
    from tqdm import tqdm

    from streamwal.client.node_client import NodeClient
    from streamwal.errors import StreamingError

    async with NodeClient(node) as nc:
        try:
            if assign:
                await nc.assign(pchannel, term)
            producer = await nc.producer(pchannel, term, ack_level=ack_level)
        except StreamingError as err:
            raise click.ClickException(str(err)) from None
        total = count
        bar = tqdm(total=total, unit="msg", disable=not progress, file=sys.stderr)
        first = last = None
        sent = 0
        started = time.perf_counter()

        async def chunks():
            if count is not None:
                payload = b"x" * size
                for start in range(0, count, batch):
                    yield [payload] * min(batch, count - start)
            else:
                buf = []
                for line in sys.stdin.buffer:
                    buf.append(line.rstrip(b"\n"))
                    if len(buf) >= batch:
                        yield buf
                        buf = []
                if buf:
                    yield buf

        pending: set[asyncio.Task] = set()
        try:
            async for chunk in chunks():
                task = asyncio.ensure_future(producer.send_many(chunk, vchannel=vchannel))
                pending.add(task)
                if len(pending) >= 8:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        res = t.result()
                        first = res[0].offset if first is None else min(first, res[0].offset)
                        last = res[-1].offset if last is None else max(last, res[-1].offset)
                        sent += len(res)
                        bar.update(len(res))
            for t in asyncio.as_completed(pending):
                res = await t
                first = res[0].offset if first is None else min(first, res[0].offset)
                last = res[-1].offset if last is None else max(last, res[-1].offset)
                sent += len(res)
                bar.update(len(res))
        except StreamingError as err:
            raise click.ClickException(str(err)) from None
        finally:
            bar.close()
            await producer.close()
        secs = time.perf_counter() - started
        click.echo(
            json.dumps(
                {
                    "messages": sent,
                    "first_offset": first,
                    "last_offset": last,
                    "seconds": round(secs, 3),
                    "msgs_per_s": round(sent / secs) if secs else None,
                }
            )
        )


@click.command("consume")
@NODE
@PCHANNEL
@click.option("--term", type=TERM, required=True)
@click.option(
    "--from",
    "start",
    default="all",
    show_default=True,
    help="all, latest, or an offset to start from.",
)
@click.option("--after", type=OFFSET, default=None, help="Start after this offset.")
@click.option("--vchannel", default=None, help="Only this vchannel (and time ticks).")
@click.option(
    "--tick-gt",
    type=click.IntRange(0, 2**64 - 1),
    default=None,
    help="Only messages with a time tick above this.",
)
@click.option(
    "--count",
    type=click.IntRange(1),
    default=None,
    help="Stop after COUNT messages (default: follow forever).",
)
@click.option(
    "--time-ticks/--no-time-ticks",
    default=False,
    show_default=True,
    help="Print TimeTick messages.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["json", "raw"]), default="json", show_default=True
)
def consume(node, pchannel, term, start, after, vchannel, tick_gt, count, time_ticks, fmt) -> None:
    """Read messages and print one per line (JSON with offset, tick, properties, payload)."""
    if after is not None:
        policy = DeliverPolicy.start_after(after)
    elif start == "all":
        policy = DeliverPolicy.all()
    elif start == "latest":
        policy = DeliverPolicy.latest()
    else:
        try:
            policy = DeliverPolicy.start_from(OFFSET.convert(start, None, None))
        except click.BadParameter:
            raise click.BadParameter(
                f"{start!r}: use all, latest or an offset 0..{2**63 - 1}", param_hint="--from"
            ) from None
    filters = []
    if vchannel:
        filters.append(DeliverFilter.vchannel(vchannel))
    if tick_gt is not None:
        filters.append(DeliverFilter.time_tick_gt(tick_gt))
    _run(_consume(node, pchannel, term, policy, filters, count, time_ticks, fmt))


async def _consume(node, pchannel, term, policy, filters, count, time_ticks, fmt) -> None:
    from streamwal.client.node_client import NodeClient
    from streamwal.errors import StreamingError
    from streamwal.message import MsgType

    out = sys.stdout.buffer
    seen = 0
    async with NodeClient(node) as nc:
        try:
            consumer = await nc.consumer(pchannel, term, policy, filters)
            async for m in consumer:
                if m.msg_type == MsgType.TimeTick and not time_ticks:
                    continue
                if fmt == "raw":
                    out.write(m.payload + b"\n")
                else:
                    line = {
                        "offset": m.offset,
                        "term": m.term,
                        "time_tick": m.time_tick,
                        "properties": m.properties,
                        "payload": m.payload.decode("utf-8", "backslashreplace"),
                    }
                    out.write(json.dumps(line).encode() + b"\n")
                seen += 1
                if count is not None and seen >= count:
                    break
            out.flush()
            await consumer.close()
        except StreamingError as err:
            raise click.ClickException(str(err)) from None
