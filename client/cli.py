"""`streamwal produce` and `streamwal consume`: channels by name, through the coord.

By default both connect to the coord (`--coord`, or STREAMWAL_COORD) and follow the
channel wherever it is served, across failovers, like the routed client (`client/wal.py`).
`--node/--term` talk to one node under one term (experts: benchmarks, a node without a
coord); they do not follow a move. Input and output lines: `client/cli_lines.py`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import click

from streamwal.cli import Address, Duration, coord_option
from streamwal.client import cli_lines
from streamwal.client.policy import DeliverFilter, DeliverPolicy

TERM = click.IntRange(1, 2**63 - 1)
OFFSET = click.IntRange(0, 2**63 - 1)
INFLIGHT = 8  # batches a produce keeps in flight
CONNECT_TIMEOUT = 10.0  # seconds to reach the coord and get its first assignment


def _run(coro) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def _channel(channel: str | None, pchannel: str | None) -> str:
    if channel and pchannel and channel != pchannel:
        raise click.UsageError(f"CHANNEL {channel!r} and --pchannel {pchannel!r} differ")
    name = channel or pchannel
    if not name:
        raise click.UsageError("name the channel: streamwal COMMAND CHANNEL")
    return name


def _expert(opts: dict) -> bool:
    """Whether to use one node directly (--node); --term/--assign need it."""
    if opts["node"] is None:
        for flag in ("term", "assign"):
            if opts.get(flag):
                raise click.UsageError(f"--{flag} goes with --node (without it: --coord)")
        return False
    if opts["term"] is None:
        raise click.UsageError("--node needs --term (the term the pchannel is served under)")
    return True


async def _coord_knows(coord: str, name: str, timeout: float = 2.0) -> bool | None:
    """Whether the coord at `coord` manages `name` (None: no coord answers there)."""
    from grpc import aio

    from streamwal import transport
    from streamwal.grpc_errors import from_trailing
    from streamwal.proto import coord_pb2 as cpb
    from streamwal.proto import coord_pb2_grpc as cpbg

    async with transport.make_channel(coord) as ch:
        stub = cpbg.StreamingCoordChannelServiceStub(ch)
        try:
            await stub.DescribeChannels(
                cpb.DescribeChannelsRequest(channel_names=[name]), timeout=timeout
            )
        except aio.AioRpcError as err:
            typed = from_trailing(err.trailing_metadata())
            return False if typed is not None else None
    return True


async def _connect(coord: str, channel: str):
    """The routed client, once the coord answers and `channel` resolves: a typo, or a
    pchannel that lost acknowledged records, fails at once with the coord's reason."""
    from streamwal.client.wal import open_wal
    from streamwal.errors import Unavailable

    try:
        wal = await open_wal(coord, timeout=CONNECT_TIMEOUT)
    except Unavailable:
        raise click.ClickException(
            f"no coord answers at {coord} (--coord, STREAMWAL_COORD)"
        ) from None
    try:
        await wal.resolve(channel)
    except BaseException:
        await wal.close()
        raise
    return wal


async def _until_signalled(work: Callable[[], Awaitable[None]]) -> bool:
    """Run `work`; SIGTERM or SIGINT cancels it (its `finally` flushes and closes). True
    when it was stopped so."""
    task = asyncio.ensure_future(work())
    loop = asyncio.get_running_loop()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await task
    except asyncio.CancelledError:
        if not stopped:
            raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return stopped


_NODE = click.option(
    "--node",
    type=Address(),
    default=None,
    help="Expert: use this node directly, under --term (no failover; skips the coord).",
)
_PCHANNEL = click.option("--pchannel", default=None, help="Same as CHANNEL (older spelling).")
_TERM = click.option(
    "--term",
    type=TERM,
    default=None,
    help="Expert, with --node: the term the pchannel is served under.",
)


@click.command("produce")
@click.argument("channel", required=False)
@coord_option()
@_NODE
@_PCHANNEL
@_TERM
@click.option(
    "--assign",
    is_flag=True,
    help="Expert, with --node, for a node no coord manages: assign the pchannel to it "
    "under --term first. Refused when the coord (--coord) manages the channel: the coord "
    "would fence that term away, and with it messages acknowledged under it.",
)
@click.option("--vchannel", default=None, help="Set `_vc` on every message.")
@click.option(
    "--key-separator",
    default=None,
    help="Each input line is KEY<SEP>PAYLOAD (a line without SEP is an error).",
)
@click.option(
    "--property",
    multiple=True,
    metavar="KEY=VALUE",
    help="A property of every message (repeatable; keys starting with '_' are reserved).",
)
@click.option(
    "--input",
    type=click.Choice(cli_lines.INPUTS),
    default="text",
    show_default=True,
    help="text: a line is a payload (see --key-separator); json: a line is "
    '{"payload": BASE64 | "text": STR, "key": STR, "properties": {...}}, '
    "as `consume --format json` prints.",
)
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
    help="Messages per batch (stdin is read up to this many lines at a time).",
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
def produce(**opts) -> None:
    """Append messages to CHANNEL: stdin lines (one message each), or --count synthetic
    ones. Through the coord the producer follows the channel across failovers and resends
    what was not acknowledged (each message once: the producer is idempotent).

    Prints one JSON summary line: messages, first/last offset, seconds, msgs/s."""
    name = _channel(opts["channel"], opts["pchannel"])
    expert = _expert(opts)
    try:
        props = dict(cli_lines.parse_property(p) for p in opts["property"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--property") from None
    separator = opts["key_separator"]
    if separator is not None and (separator == "" or opts["input"] == "json"):
        raise click.BadParameter(
            "must be non-empty, and goes with --input text", param_hint="--key-separator"
        )
    if opts["count"] is not None and (separator is not None or opts["input"] == "json"):
        raise click.UsageError("--count sends synthetic messages: no --key-separator/--input json")
    _run(_produce(name, expert, props, opts))


async def _produce(name: str, expert: bool, props: dict[str, str], opts: dict) -> None:
    from tqdm import tqdm

    from streamwal.errors import StreamingError

    try:
        if expert:
            from streamwal.client.node_client import NodeClient

            if opts["assign"] and await _coord_knows(opts["coord"], name):
                raise click.ClickException(
                    f"--assign refused: the coord at {opts['coord']} manages {name!r}; it "
                    f"would fence term {opts['term']} away with the messages acknowledged "
                    f"under it. Produce through the coord: streamwal produce {name}"
                )
            async with NodeClient(opts["node"]) as nc:
                if opts["assign"]:
                    await nc.assign(name, opts["term"])
                producer = await nc.producer(name, opts["term"], ack_level=opts["ack_level"])
                await _send_all(producer, opts["vchannel"], props, opts, tqdm)
        else:
            wal = await _connect(opts["coord"], name)
            try:
                producer = await wal.producer(name, ack_level=opts["ack_level"])
                await _send_all(producer, opts["vchannel"] or producer.vchannel, props, opts, tqdm)
            finally:
                await wal.close()
    except StreamingError as err:
        raise click.ClickException(str(err)) from None


async def _records(opts: dict, props: dict[str, str]) -> AsyncIterator[list[cli_lines.Record]]:
    """Batches of records: synthetic ones, or stdin's lines (read off the event loop)."""
    batch, count = opts["batch"], opts["count"]
    if count is not None:
        record = cli_lines.Record(b"x" * opts["size"], None, props)
        for start in range(0, count, batch):
            yield [record] * min(batch, count - start)
        return
    sep = opts["key_separator"].encode() if opts["key_separator"] is not None else None
    json_input = opts["input"] == "json"
    stdin = sys.stdin.buffer
    number = 0
    while True:
        lines = await asyncio.to_thread(_read_lines, stdin, batch)
        if not lines:
            return
        out = []
        for line in lines:
            number += 1
            try:
                record = cli_lines.parse_line(line, number, sep, json_input)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
            out.append(cli_lines.Record(record.payload, record.key, {**props, **record.properties}))
        yield out


def _read_lines(stream, limit: int) -> list[bytes]:
    """Up to `limit` lines without their newline; fewer once the input pauses (a line
    typed by hand goes out at once) or ends."""
    import select

    lines: list[bytes] = []
    while len(lines) < limit:
        if lines and not _ready(select, stream):
            break
        line = stream.readline()
        if not line:
            break
        lines.append(line.rstrip(b"\n").removesuffix(b"\r"))
    return lines


def _ready(select_module, stream) -> bool:
    try:
        return bool(select_module.select([stream], [], [], 0)[0])
    except (ValueError, OSError):  # not selectable (a file on some systems): keep reading
        return True


async def _send_all(
    producer, vchannel: str | None, props: dict[str, str], opts: dict, tqdm
) -> None:
    from streamwal.message import PROP_VCHANNEL
    from streamwal.protowire import encode_entry, encode_properties

    bar = tqdm(total=opts["count"], unit="msg", disable=not opts["progress"], file=sys.stderr)
    first = last = None
    sent = 0
    started = time.perf_counter()
    blobs: dict[tuple, bytes] = {}

    def entry(record: cli_lines.Record) -> bytes:
        all_props = record.all_properties()
        if vchannel is not None:
            all_props = {**all_props, PROP_VCHANNEL: vchannel}
        key = tuple(sorted(all_props.items()))
        blob = blobs.get(key)
        if blob is None:
            blob = encode_properties(all_props)
            if len(blobs) < 1024:
                blobs[key] = blob
        return encode_entry(record.payload, blob)

    def settle(done: asyncio.Task) -> None:
        nonlocal first, last, sent
        base, n = done.result()
        first = base if first is None else min(first, base)
        last = base + n - 1 if last is None else max(last, base + n - 1)
        sent += n
        bar.update(n)

    async def one(entries: list[bytes]) -> tuple[int, int]:
        base, _tick = await producer.send_batch(entries)
        return base, len(entries)

    pending: set[asyncio.Task] = set()
    try:
        async for records in _records(opts, props):
            pending.add(asyncio.ensure_future(one([entry(r) for r in records])))
            if len(pending) >= INFLIGHT:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    settle(task)
        if pending:
            done, pending = await asyncio.wait(pending)
            for task in done:
                settle(task)
    finally:
        for task in pending:
            task.cancel()
        bar.close()
        await producer.close()
    secs = time.perf_counter() - started
    summary = {
        "messages": sent,
        "first_offset": first,
        "last_offset": last,
        "seconds": round(secs, 3),
        "msgs_per_s": round(sent / secs) if secs else None,
    }
    click.echo(json.dumps(summary))


@click.command("consume")
@click.argument("channel", required=False)
@coord_option()
@_NODE
@_PCHANNEL
@_TERM
@click.option(
    "--from",
    default=None,
    help="earliest (the default; `all` too), latest (only messages appended after the "
    "start, as Kafka's), or an offset to start from.",
)
@click.option("--after", type=OFFSET, default=None, help="Start after this offset.")
@click.option(
    "--group",
    default=None,
    help="Consume as a member of consumer group NAME (created on first use): members "
    "share the channel's messages, and the group's position survives restarts.",
)
@click.option(
    "--at-most-once",
    is_flag=True,
    help="With --group: the group's position moves when messages are handed out (none "
    "is ever delivered twice; those in flight when a member dies are lost). Default: "
    "at-least-once, each batch committed once printed, a dead member's uncommitted "
    "messages redelivered to the others.",
)
@click.option(
    "--session-timeout",
    type=Duration(low=0.1, high=3600),
    default=10.0,
    show_default=True,
    help="With --group: a member silent this long is gone; its uncommitted messages go "
    "to the other members.",
)
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
    "--format",
    type=click.Choice(cli_lines.FORMATS),
    default="json",
    show_default=True,
    help="json: one object per message, payload base64; raw: the payload bytes; text: "
    "OFFSET<TAB>KEY<TAB>PAYLOAD as UTF-8.",
)
@click.option(
    "--show-internal",
    is_flag=True,
    help="json: also show the internal properties (_tt, _wt, _vc, _t, _key...).",
)
def consume(**opts) -> None:
    """Read CHANNEL and print one line per message, flushed as it arrives (`| jq` sees
    each at once; SIGTERM stops it without losing a printed line). Through the coord the
    consumer follows the channel across failovers and never repeats an offset."""
    name = _channel(opts["channel"], opts["pchannel"])
    expert = _expert(opts)
    if opts["group"] is None and opts["at_most_once"]:
        raise click.UsageError("--at-most-once goes with --group")
    if opts["group"] is not None:
        if expert:
            raise click.UsageError("--group goes through the coord: leave out --node/--term")
        for flag in ("from", "after", "tick_gt"):
            if opts[flag] is not None:
                raise click.UsageError(
                    f"--{flag.replace('_', '-')} and --group: a group reads from its own position"
                )
    try:
        start = cli_lines.parse_start(opts["from"] or "earliest")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from") from None
    if opts["after"] is not None:
        if opts["from"] is not None:
            raise click.UsageError("--from and --after: give one")
        start = ("after", opts["after"])
    filters = []
    if opts["vchannel"]:
        filters.append(DeliverFilter.vchannel(opts["vchannel"]))
    if opts["tick_gt"] is not None:
        filters.append(DeliverFilter.time_tick_gt(opts["tick_gt"]))
    if _run(_until_signalled(lambda: _consume(name, expert, start, filters, opts))):
        sys.exit(0)


def _policy(start: tuple[str, int], end_offset: int | None):
    kind, offset = start
    if kind == "earliest":
        return DeliverPolicy.all()
    if kind == "after":
        return DeliverPolicy.start_after(offset)
    if kind == "latest":
        return DeliverPolicy.start_from(end_offset or 0)
    return DeliverPolicy.start_from(offset)


async def _consume(name: str, expert: bool, start, filters, opts: dict) -> None:
    from streamwal.errors import StreamingError

    try:
        if expert:
            await _consume_node(name, start, filters, opts)
        else:
            wal = await _connect(opts["coord"], name)
            try:
                await _consume_routed(wal, name, start, filters, opts)
            finally:
                await wal.close()
    except StreamingError as err:
        raise click.ClickException(str(err)) from None


async def _consume_node(name: str, start, filters, opts: dict) -> None:
    from streamwal.client.node_client import NodeClient

    async with NodeClient(opts["node"]) as nc:
        end = None
        if start[0] == "latest":
            status = await nc.collect_status()
            ends = [c.next_offset for c in status.channels if c.pchannel.name == name]
            end = ends[0] if ends else 0
        consumer = await nc.consumer(
            name, opts["term"], _policy(start, end), filters, time_ticks=opts["time_ticks"]
        )
        try:
            await _print(name, lambda _limit: consumer.next_batch(), opts)
        finally:
            await consumer.close()


async def _consume_routed(wal, name: str, start, filters, opts: dict) -> None:
    if opts["group"] is not None:
        from streamwal.client.consumer_group import GroupConsumer, RoutedGroup

        pchannel, vchannel = await wal.resolve(name)
        group = RoutedGroup(
            wal,
            pchannel,
            opts["group"],
            vchannel,
            at_least_once=not opts["at_most_once"],
            session_timeout=opts["session_timeout"],
        )
        await group.create()
        # Each batch is committed once its lines are out (flushed): at-least-once for
        # whoever reads them. Fetches ask for no more than --count still wants.
        members = GroupConsumer(group, auto_commit_interval=None)
        try:
            await _print(name, members.next_batch, opts, group.commit)
        finally:
            await members.close()
            if group.redelivered:
                click.echo(f"redelivered: {group.redelivered} messages", err=True)
        return
    end = None
    if start[0] == "latest":
        pchannel, _ = await wal.resolve(name)
        end = await wal.end_offset(pchannel)
    consumer = await wal.consumer(name, _policy(start, end), filters, time_ticks=opts["time_ticks"])
    try:
        await _print(name, lambda _limit: consumer.next_batch(), opts)
    finally:
        await consumer.close()


async def _print(
    name: str,
    next_batch: Callable[[int], Awaitable[Any]],
    opts: dict,
    flushed: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Write each batch's lines and flush them (then call `flushed`) before waiting for
    the next; `next_batch(limit)` fetches at most about `limit` messages (a group's
    exactly)."""
    from streamwal.message import MsgType

    out = sys.stdout.buffer
    count, fmt, internal = opts["count"], opts["format"], opts["show_internal"]
    seen = 0
    while count is None or seen < count:
        batch = await next_batch(256 if count is None else min(256, count - seen))
        if batch is None:
            return
        for m in batch:
            if m.msg_type == MsgType.TimeTick and not opts["time_ticks"]:
                continue
            out.write(
                cli_lines.format_message(
                    name, m.offset, m.time_tick, m.properties, m.payload, fmt, internal
                )
            )
            seen += 1
            if count is not None and seen >= count:
                break
        out.flush()
        if flushed is not None:
            await flushed()
