"""`streamwal dev`: an embedded cluster (coord + N nodes as local processes) put through a
node crash while a routed workload runs, then checked message by message.

The story it tells, step by step:

1. start N nodes and a coord, create P pchannels, connect the routed client
   (`streamwal.client.wal.open_wal`) and start one idempotent producer per pchannel;
2. at a fraction of the workload, SIGKILL the node owning the most pchannels; restart it
   after `--restart-after` seconds on the same data and address (as a StatefulSet would);
3. the coord keeps the dead node's pchannels where they are for the grace period: when
   the node is back in time they are assigned again under a higher term -- on the
   restarted node, or on another one that first copies the log from it (catch-up); when
   it is not (`--no-restart`), a single-replica pchannel waits for it (safe failover),
   unless it allows data loss (`--allow-data-loss`): then after the grace period it
   fails over *uncleanly* and the records on the dead node are stranded -- the summary
   says so and the command fails;
4. producers reroute on their own (report to the coord, wait for the next assignment,
   resend what was not acknowledged, the node answers resent batches it already has);
5. every pchannel is read back from its current owner; every acknowledged message must be
   there exactly once, at its acknowledged offset, in per-producer order.

stdout gets the failover table and the verdict, then one JSON line (last); stderr gets
the progress bar. Exit status 1 on any loss, duplicate, reordering or stranded message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
from click.core import ParameterSource

from streamwal.cli import Address
from streamwal.client.routing import Reroute, RoutedProducer
from streamwal.client.wal import WAL, open_wal
from streamwal.errors import StreamingError
from streamwal.testing.history import Acked, Verdict, check, payload, read_log
from streamwal.testing.local_cluster import LocalCluster

WINDOW = 64  # sends in flight per producer
DEFAULT_COORD = "127.0.0.1:19500"  # the CLI's default --coord


@dataclass
class DevConfig:
    nodes: int = 3
    pchannels: int = 4
    replicas: int = 1  # copies of each pchannel's log (odd); > 1: quorum acknowledgement
    messages: int = 20_000
    kill_at: float = 0.3
    restart_after: float | None = 1.0  # None: the killed node stays down
    grace: float = 10.0
    probe_interval: float = 0.25
    allow_data_loss: bool = False  # single copies may move without their records
    timeout: float = 60.0


@dataclass
class ProducerRun:
    """What one producer sent and what the cluster acknowledged (payloads `name:index`)."""

    name: str
    pchannel: str
    producer: RoutedProducer
    acked: dict[int, int] = field(default_factory=dict)  # message index -> offset
    failed: int = 0


@dataclass
class Failover:
    pchannel: str
    old_node: int
    old_term: int
    new_node: int | None = None
    new_term: int | None = None
    recovered_s: float | None = None  # from the kill to the producer's first rerouted send
    catch_up_from: int | str | None = None  # node id the new owner copied the log from
    unclean: bool = False
    replicated: bool = False  # a replica took over (members in the coord's event)
    later: list[tuple[int, int]] = field(default_factory=list)  # further moves (node, term)


async def produce_range(
    run: ProducerRun, start: int, stop: int, tick: Callable[[], None], deadline: float
) -> None:
    """Send messages [start, stop) with WINDOW in flight; record every acknowledgement."""
    slots = asyncio.Semaphore(WINDOW)

    async def one(i: int) -> None:
        try:
            result = await run.producer.send(payload(run.name, i))
            run.acked[i] = result.offset
            tick()
        except StreamingError:
            run.failed += 1
        finally:
            slots.release()

    tasks = []
    for i in range(start, stop):
        if time.monotonic() > deadline:
            break
        await slots.acquire()
        tasks.append(asyncio.ensure_future(one(i)))
    if tasks:
        await asyncio.gather(*tasks)


async def verify(wal: WAL, run: ProducerRun) -> Verdict:
    """Read the run's pchannel back from its current owner and check the run's messages
    (streamwal.testing.history: every ack there once, at its offset, in order)."""
    end = await wal.end_offset(run.pchannel)
    consumer = await wal.consumer(run.pchannel, end_offset=end)
    seen: list[tuple[int, bytes]] = []
    try:
        async for message in consumer:
            seen.append((message.offset, message.payload))
    finally:
        await consumer.close()
    acked = [Acked(run.name, index, offset) for index, offset in run.acked.items()]
    return check([read_log(f"{run.pchannel} as consumed", seen)], acked)


def _victim(wal: WAL) -> int:
    """The node owning the most pchannels (lowest id on ties)."""
    load: dict[int, int] = {}
    for route in wal.assignments().values():
        load[route.server_id] = load.get(route.server_id, 0) + 1
    return min(load, key=lambda n: (-load[n], n))


def _failovers(
    before: dict,
    runs: dict[str, ProducerRun],
    killed_at: float,
    victim: int,
    events: list[dict],
    nodes: dict[str, int],
) -> list[Failover]:
    """One row per pchannel the victim owned: its first assignment after the kill (from
    the coord's log), later moves (a rebalance once the node is back), producer recovery."""
    out = []
    for name, route in sorted(before.items()):
        if route.server_id != victim:
            continue
        f = Failover(name, route.server_id, route.term)
        moves: list[Reroute] = [r for r in runs[name].producer.reroutes if r.finished >= killed_at]
        if moves:
            f.recovered_s = round(moves[0].finished - killed_at, 3)
        for event in events:
            if event.get("pchannel") != name or event.get("old_term", -1) < route.term:
                continue
            if f.new_node is None:
                f.new_node, f.new_term = event.get("new_node"), event.get("new_term")
                source = event.get("catch_up_from")
                f.catch_up_from = nodes.get(source, source) if source else None
                f.unclean = bool(event.get("unclean"))
                f.replicated = bool(event.get("members"))
            else:
                f.later.append((event.get("new_node"), event.get("new_term")))
        out.append(f)
    return out


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


async def run_dev(config: DevConfig, root: Path, echo: Callable[[str], None]) -> dict:
    """Run the whole story; returns the summary (its `ok` says whether anything was lost)."""
    from tqdm import tqdm

    started = time.monotonic()
    cluster = LocalCluster(
        root,
        nodes=config.nodes,
        probe_interval=config.probe_interval,
        grace=config.grace,
        log_level="warning",
    )
    wal: WAL | None = None
    restart: asyncio.Task | None = None
    try:
        await cluster.start()
        echo(
            f"coord {cluster.coord_address}, nodes "
            + ", ".join(f"{i}={cluster.node_address(i)}" for i in cluster.node_ids)
            + f" (grace {config.grace}s, data in {root})"
        )
        names = await cluster.create_channels(
            config.pchannels, replicas=config.replicas, allow_data_loss=config.allow_data_loss
        )
        wal = await open_wal(cluster.coord_address, failover_timeout=config.timeout / 2)
        for name in names:
            await wal.resolve(name, timeout=15)
        runs = {n: ProducerRun(n, n, await wal.producer(n, producer_id=f"dev-{n}")) for n in names}
        per = config.messages // len(names)
        total = per * len(names)
        kill_threshold = int(total * config.kill_at)
        deadline = time.monotonic() + config.timeout
        bar = tqdm(total=total, unit="msg", file=sys.stderr, desc="produce", leave=False)
        acked = 0
        kill_due = asyncio.Event()

        def tick() -> None:
            nonlocal acked
            acked += 1
            bar.update(1)
            if acked >= kill_threshold:
                kill_due.set()

        workload_started = time.monotonic()
        work = asyncio.gather(*(produce_range(r, 0, per, tick, deadline) for r in runs.values()))
        await asyncio.wait(
            [asyncio.ensure_future(kill_due.wait()), work], return_when=asyncio.FIRST_COMPLETED
        )
        before = wal.assignments()
        victim = _victim(wal)
        cluster.kill_node(victim)
        killed_at = time.monotonic()
        bar.write(
            f"kill -9 node {victim} after {acked} acknowledged messages "
            f"(it owns {sum(r.server_id == victim for r in before.values())} pchannels)"
        )
        if config.restart_after is not None:

            async def restart_later() -> float:
                await asyncio.sleep(config.restart_after)
                await cluster.start_node(victim)
                bar.write(f"node {victim} restarted on the same data and address")
                return time.monotonic() - killed_at

            restart = asyncio.create_task(restart_later())
        await work
        bar.close()
        produce_s = time.monotonic() - workload_started
        for r in runs.values():
            await r.producer.close()
        restarted_s = await restart if restart is not None else None

        events = cluster.coord_events("pchannel assigned", "failover done")
        addresses = {cluster.node_address(i): i for i in cluster.node_ids}
        failovers = _failovers(before, runs, killed_at, victim, events, addresses)
        checks = {n: await verify(wal, r) for n, r in runs.items()}
        unclean = [f.pchannel for f in failovers if f.unclean]
        stranded = sum(checks[n].counts["lost"] for n in unclean)
        totals = Verdict()
        for c in checks.values():
            totals.merge(c)
        ok = totals.ok and not any(r.failed for r in runs.values())
        ok = ok and all(f.new_term is not None and f.new_term > f.old_term for f in failovers)
        summary = {
            "ok": ok,
            "nodes": config.nodes,
            "pchannels": config.pchannels,
            "replicas": config.replicas,
            "killed_node": victim,
            "restarted_after_s": round(restarted_s, 3) if restarted_s is not None else None,
            "grace_s": config.grace,
            "sent": total,
            "acknowledged": totals.acknowledged,
            "send_failures": sum(r.failed for r in runs.values()),
            "read_back": totals.read_back,
            "missing": totals.counts["lost"],
            "duplicates": totals.counts["duplicate"],
            "out_of_order": totals.counts["out_of_order"],
            "moved_offset": totals.counts["moved"],
            "unacknowledged_present": totals.unacknowledged,
            "violations": dict(totals.counts),
            "problems": totals.problems[:10],
            "unclean_failovers": unclean,
            "stranded_on_killed_node": stranded,
            "failovers": [vars(f) for f in failovers],
            "recovery_s_max": max((f.recovered_s or 0.0 for f in failovers), default=0.0),
            "produce_s": round(produce_s, 3),
            "msgs_per_s": round(totals.acknowledged / produce_s) if produce_s else 0,
            "total_s": round(time.monotonic() - started, 3),
        }
        return summary
    finally:
        if restart is not None and not restart.done():
            restart.cancel()
        if wal is not None:
            await wal.close()
        await cluster.close()


def render(summary: dict) -> str:
    """The human part of the output: failover table, checks, verdict."""
    rows = [["PCHANNEL", "OLD NODE", "NEW NODE", "TERM", "RECOVERED", "HOW"]]
    for f in summary["failovers"]:
        if f["unclean"]:
            how = "UNCLEAN: no catch-up (node lost), its records stranded"
        elif f["catch_up_from"] is not None:
            how = f"moved, log copied from the restarted node {f['catch_up_from']}"
        elif f["replicated"]:
            how = (
                "the restarted node led again (its log was complete)"
                if f["new_node"] == f["old_node"]
                else "a follower with the whole log took over"
            )
        elif f["new_node"] == f["old_node"]:
            how = "re-assigned on the restarted node (its own log)"
        else:
            how = "-"
        for node, term in f["later"]:
            how += f"; then rebalanced to node {node} (term {term})"
        rows.append(
            [
                f["pchannel"],
                str(f["old_node"]),
                str(f["new_node"] if f["new_node"] is not None else "-"),
                f"{f['old_term']} -> {f['new_term'] if f['new_term'] is not None else '?'}",
                f"{f['recovered_s']:.2f}s" if f["recovered_s"] is not None else "-",
                how,
            ]
        )
    restarted = summary["restarted_after_s"]
    lines = [
        "",
        f"failover of node {summary['killed_node']} (kill -9; "
        + (
            f"restarted {restarted:.2f}s later; coord grace period {summary['grace_s']}s"
            if restarted is not None
            else "never restarted"
        )
        + "):",
        _table(rows),
        "",
        f"acknowledged {summary['acknowledged']} of {summary['sent']} sent; read back "
        f"{summary['read_back']}: missing {summary['missing']}, duplicates "
        f"{summary['duplicates']}, out of order {summary['out_of_order']}, at another offset "
        f"{summary['moved_offset']}; send failures {summary['send_failures']}",
        f"produce {summary['produce_s']:.2f}s ({summary['msgs_per_s']} msg/s acknowledged), "
        f"worst recovery {summary['recovery_s_max']:.2f}s after the kill, "
        f"total {summary['total_s']:.2f}s",
    ]
    if summary["unclean_failovers"]:
        lines.append(
            f"UNCLEAN failover of {', '.join(summary['unclean_failovers'])}: node "
            f"{summary['killed_node']} was declared lost before it came back, so the new owner "
            f"could not copy its log; {summary['stranded_on_killed_node']} acknowledged "
            "messages are stranded on it."
        )
    lines.append(
        "OK: every acknowledged message is there exactly once, in per-producer order."
        if summary["ok"]
        else "FAILED: acknowledged messages are missing, doubled or out of order."
    )
    return "\n".join(lines)


@click.command("dev")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(2, 16))
@click.option("--pchannels", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--messages", default=20_000, show_default=True, type=click.IntRange(10, 10_000_000))
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(1, 9),
    help="Copies of each pchannel's log on distinct nodes (odd); with 3, a killed node's "
    "pchannels fail over to an up-to-date follower: nothing acknowledged is stranded.",
)
@click.option(
    "--kill-at",
    default=0.3,
    show_default=True,
    type=click.FloatRange(0.0, 0.95),
    help="Kill a node once this fraction of the messages is acknowledged.",
)
@click.option(
    "--restart-after",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.0, 60.0),
    help="Seconds until the killed node is restarted (as a StatefulSet would).",
)
@click.option(
    "--no-restart",
    is_flag=True,
    help="Leave the killed node down (with --replicas 1 it needs --allow-data-loss).",
)
@click.option(
    "--allow-data-loss",
    is_flag=True,
    help="Create the pchannels allowing an unclean failover: a single copy whose node is "
    "gone past the grace moves without its records (the summary counts them).",
)
@click.option(
    "--grace",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.2, 120.0),
    help="Coord: seconds without an answer before a node is declared lost.",
)
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(5.0, 3600.0),
    help="Bound on the workload (sends stop after it).",
)
@click.option("--workdir", type=click.Path(file_okay=False), help="Keep the data here.")
@click.option(
    "--serve",
    is_flag=True,
    help="Keep a coord and --nodes nodes up to play with (a node that exits is started "
    "again); print the address and what to try; Ctrl-C stops them. No demo run.",
)
@click.option(
    "--listen",
    default=DEFAULT_COORD,
    show_default=True,
    type=Address(listen=False),
    help="With --serve: the coord's gRPC HOST:PORT (the CLI's default --coord).",
)
@click.pass_context
def dev(
    ctx: click.Context,
    nodes: int,
    pchannels: int,
    messages: int,
    replicas: int,
    kill_at: float,
    restart_after: float,
    no_restart: bool,
    allow_data_loss: bool,
    grace: float,
    timeout: float,
    workdir: str | None,
    serve: bool,
    listen: str,
) -> None:
    """Embedded cluster: coord + nodes, a routed workload, a node kill -9, a full check;
    with --serve, a coord and nodes kept up for you to use."""
    if serve:
        _serve(ctx, nodes, grace, listen, workdir)
        return
    if ctx.get_parameter_source("listen") != ParameterSource.DEFAULT:
        raise click.UsageError("--listen goes with --serve")
    if replicas % 2 == 0 or replicas > nodes:
        raise click.BadParameter(
            f"must be odd and at most --nodes ({nodes})", param_hint="--replicas"
        )
    if no_restart and replicas == 1 and not allow_data_loss:
        raise click.BadParameter(
            "with one copy per pchannel and the killed node left down, its pchannels wait "
            "for it for ever (safe failover); add --allow-data-loss to see an unclean "
            "failover, or --replicas 3 to see a clean one",
            param_hint="--no-restart",
        )
    config = DevConfig(
        nodes=nodes,
        pchannels=pchannels,
        messages=messages,
        replicas=replicas,
        kill_at=kill_at,
        restart_after=None if no_restart else restart_after,
        grace=grace,
        timeout=timeout,
        allow_data_loss=allow_data_loss,
    )
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="streamwal-dev-"))

    async def bounded() -> dict:
        # Whatever happens, the run ends (and run_dev's `finally` kills every process).
        return await asyncio.wait_for(
            run_dev(config, root, lambda m: click.echo(m, err=True)), 2 * timeout + 60
        )

    # SIGTERM (a supervisor, a test's timeout) behaves like Ctrl-C: the run is cancelled
    # and its `finally` kills every node and the coord. (Only SIGKILL leaves them behind.)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        summary = asyncio.run(bounded())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except TimeoutError:
        click.echo(f"FAILED: the run did not finish within {2 * timeout + 60:.0f}s")
        click.echo(json.dumps({"ok": False, "error": "timeout"}))
        raise SystemExit(1) from None
    finally:
        if not workdir:
            shutil.rmtree(root, ignore_errors=True)
    click.echo(render(summary))
    click.echo(json.dumps(summary))
    sys.exit(0 if summary["ok"] else 1)


DEMO_ONLY = (
    "pchannels",
    "messages",
    "replicas",
    "kill_at",
    "restart_after",
    "no_restart",
    "allow_data_loss",
    "timeout",
)


def _serve(ctx: click.Context, nodes: int, grace: float, listen: str, workdir: str | None) -> None:
    from streamwal.testing.dev_serve import serve

    given = [
        "--" + n.replace("_", "-")
        for n in DEMO_ONLY
        if ctx.get_parameter_source(n) != ParameterSource.DEFAULT
    ]
    if given:
        raise click.UsageError(f"{', '.join(given)}: demo options, not for --serve")
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="streamwal-dev-"))

    def say(text: str) -> None:
        click.echo(text)
        sys.stdout.flush()

    try:
        asyncio.run(serve(root, nodes, grace, listen, listen == DEFAULT_COORD, say))
    except KeyboardInterrupt:  # Ctrl-C before serve() took the signals over
        return
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from None
    finally:
        if not workdir:
            shutil.rmtree(root, ignore_errors=True)
