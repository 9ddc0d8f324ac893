"""`streamwal bench trace`: where a one-at-a-time send's latency goes, from the kernel.

Timers inside a server only see the server, and they cost time themselves. The
scheduler's own events (`sched_switch`, `sched_waking` in tracefs) show every process
on the path without touching it: the client is switched in and wakes the server, the
server runs until it wakes the client with the answer, the client runs again. At a
moderate open-loop rate each send walks that path alone, so per send:

- `client_send_us`: from the client being woken for a send (by the benchmark's clock
  thread) to its request waking the server;
- `server_us`: from the request waking the server to the server's answer waking the
  client: the server's share of the latency, its wait to run and syscalls included;
- `client_answer_us`: from the answer waking the client to the client going to sleep.

The three add up to the send's path through the kernel. Two waits inside them are
split off where the kernel records the switch-in (not always, for a task switched in
from the idle task): `server_wait_us`, from the request waking the server to a server
thread running (on a CPU shared with the client: the rest of the client's turn), and
`wake_to_run_us`, from the answer waking the client to the client running.

Wake-ups are read from `sched_waking`, which the kernel records in the waker's own
context: `sched_wakeup` of a task on another, idle CPU is recorded there, under the
idle task, and would hide who woke it. The events of both CPUs are merged on the
`global` trace clock, which is in step across CPUs (`local`, the default, need not be).

The latency columns are measured with the trace on (recording costs the kernel a
little per event), so they read a little slower than `bench compare`'s. Needs root and
tracefs (mounted here if it is not). Peers run as in `bench compare`:
each system started afresh, the rounds taken in turns (`bench/interleaved.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from streamwal.bench import stats
from streamwal.bench import workloads as wl
from streamwal.bench.interleaved import latency_round, started_afresh, turns

TRACEFS = Path("/sys/kernel/tracing")
_EVENT = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\]\s+\S+\s+(?P<t>\d+\.\d+): "
    r"(?P<kind>sched_switch|sched_waking): (?P<rest>.*)$"
)
_WAKEE = re.compile(r"\bpid=(\d+)\b")
_PREV = re.compile(r"\bprev_pid=(\d+) .*\bprev_state=(\S+)")
_NEXT = re.compile(r"\bnext_pid=(\d+)\b")


@dataclass
class Paths:
    """Per-send spans in µs, as lists (one entry per send seen whole in the trace)."""

    client_send_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    client_answer_us: list[float] = field(default_factory=list)
    server_wait_us: list[float] = field(default_factory=list)
    wake_to_run_us: list[float] = field(default_factory=list)

    def extend(self, other: Paths) -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name in self.__dataclass_fields__:
            values = sorted(getattr(self, name))
            out[name] = {
                "n": len(values),
                **{
                    f"p{q}": round(stats.percentile(values, q), 1) if values else 0.0
                    for q in (50, 90, 99)
                },
            }
        return out


def parse(lines: Iterable[str], server: Collection[int], client: int) -> Paths:
    """The spans of `Paths` from tracefs text (the `trace` file): `server` holds the
    server's thread ids (a Go server answers from any of its threads), `client` is the
    thread running the client's event loop.

    The three turns are cut at wake-ups and at the client's going to sleep, which the
    kernel records in the acting task's own context; the switch-ins that split off the
    wait to run are taken where the kernel records them (a task switched in from the
    idle task is not always recorded). A server that preempts the client answers it
    without waking it: its turn ends when it goes to sleep and hands the CPU back. A
    span is taken only when both of its ends are seen, so sends cut by the trace
    window are left out, and so is an answer to a client still running on another CPU.
    """
    out = Paths()
    send_from: float | None = None  # the client was woken for a send (not by the server)
    request_at: float | None = None  # the client woke the server
    server_ran = False  # ... and a server thread was seen switched in since
    answer_at: float | None = None  # the server woke the client
    answer_ran = False  # ... and the client was seen switched in since
    client_preempted = False  # the client was preempted while its request was pending
    for line in lines:
        m = _EVENT.match(line)
        if m is None:
            continue
        t = float(m["t"]) * 1e6
        current = int(m["pid"])
        rest = m["rest"]
        if m["kind"] == "sched_waking":
            wakee = _WAKEE.search(rest)
            woken = int(wakee.group(1)) if wakee else -1
            if woken == client and current in server:
                if request_at is not None:
                    out.server_us.append(t - request_at)
                request_at, answer_at, answer_ran = None, t, False
            elif woken == client:
                send_from = t
            elif woken in server and current == client:
                if send_from is not None:
                    out.client_send_us.append(t - send_from)
                send_from, request_at, server_ran = None, t, False
            continue
        prev, nxt = _PREV.search(rest), _NEXT.search(rest)
        if prev is None or nxt is None:
            continue
        prev_pid, next_pid = int(prev.group(1)), int(nxt.group(1))
        asleep = prev.group(2).startswith(("S", "D"))  # not preempted: done for now
        if next_pid in server and request_at is not None and not server_ran:
            server_ran = True
            out.server_wait_us.append(t - request_at)
        if next_pid == client:
            if prev_pid in server and asleep and request_at is not None and client_preempted:
                # the server preempted the client, answered a client that needed no
                # waking, and hands the CPU back: its turn ends here
                out.server_us.append(t - request_at)
                request_at, answer_at, answer_ran = None, t, True
            elif answer_at is not None and not answer_ran:
                answer_ran = True
                out.wake_to_run_us.append(t - answer_at)
            client_preempted = False
        if prev_pid == client and not asleep and request_at is not None:
            client_preempted = True
        if prev_pid == client and asleep:  # the client's turn is over
            if answer_at is not None:
                out.client_answer_us.append(t - answer_at)
            send_from = answer_at = None
    return out


def threads(pid: int) -> set[int]:
    """The thread ids of a live process (its pid included)."""
    with contextlib.suppress(OSError):
        return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")} | {pid}
    return {pid}


def mounted_tracefs() -> Path:
    """The tracefs root, mounted if needed; raises ClickException saying why not."""
    if not (TRACEFS / "trace").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True, capture_output=True
            )
    if not os.access(TRACEFS / "trace", os.W_OK):
        raise click.ClickException(
            f"needs tracefs at {TRACEFS}, writable (run as root; "
            f"`mount -t tracefs nodev {TRACEFS}`)"
        )
    return TRACEFS


class _Tracer:
    """The scheduler events, switched on for a window of a round."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._clock = "local"

    def _write(self, name: str, value: str) -> None:
        (self._root / name).write_text(value)

    def __enter__(self) -> _Tracer:
        self._write("tracing_on", "0")
        current = re.search(r"\[(\S+)\]", (self._root / "trace_clock").read_text())
        self._clock = current.group(1) if current else "local"
        self._write("trace_clock", "global")
        self._write("buffer_size_kb", "20000")
        self._write("set_event", "sched:sched_switch sched:sched_waking")
        return self

    def __exit__(self, *exc: object) -> None:
        self._write("tracing_on", "0")
        self._write("set_event", "")
        self._write("trace_clock", self._clock)

    async def window(self, delay: float, seconds: float) -> None:
        """Events of `seconds` after `delay`; read them with `lines` once the round is
        over (reading megabytes of text on the event loop would stall the sends)."""
        await asyncio.sleep(delay)
        self._write("trace", "")
        self._write("tracing_on", "1")
        await asyncio.sleep(seconds)
        self._write("tracing_on", "0")

    def lines(self) -> list[str]:
        return (self._root / "trace").read_text().splitlines()


async def trace_rounds(
    systems: Sequence[wl.System], plan: wl.Plan, window_s: float, tick
) -> dict[str, dict]:
    """Every system started afresh; per round each in turn: an open-loop latency round
    with the trace on for `window_s` in its middle."""
    root = mounted_tracefs()
    paths = {s.name: Paths() for s in systems}
    latency: dict[str, list[dict]] = {s.name: [] for s in systems}
    by_name = {s.name: s for s in systems}
    async with started_afresh(systems) as (_, errors):
        if errors:
            raise click.ClickException(f"could not start: {errors}")
        delay = max(0.0, (plan.latency_seconds - window_s) / 2)  # the window mid-round
        with _Tracer(root) as tracer:
            for k, order in enumerate(turns([s.name for s in systems], plan.latency_rounds), 1):
                for name in order:
                    system = by_name[name]
                    window = asyncio.ensure_future(tracer.window(delay, window_s))
                    server = threads(system.server_pid)
                    try:
                        latency[name].append(await latency_round(system, f"trace-{k}", plan))
                    finally:
                        await window
                    paths[name].extend(parse(tracer.lines(), server, threading.get_native_id()))
                    tick(f"round {k}/{plan.latency_rounds} {name}")
    return {
        name: {"latency": stats.rounds_summary(latency[name]), **paths[name].summary()}
        for name in paths
    }


def _table(results: dict[str, dict]) -> str:
    """Medians in µs but for the server's tail; a wait the kernel did not record is `-`."""

    def p50(span: dict[str, float]) -> str:
        return f"{span['p50']:.0f}" if span["n"] else "-"

    rows = [
        "system            p50 ms  p99 ms  sends  client send  server µs p50 / p90 / p99"
        "  answer  server wait  wake→run"
    ]
    for name, r in results.items():
        lat, s = r["latency"], r["server_us"]
        spans = f"{s['p50']:.0f} / {s['p90']:.0f} / {s['p99']:.0f}"
        rows.append(
            f"{name:<16} {lat['p50_ms']:>7.3f} {lat['p99_ms']:>7.3f}  {s['n']:>5}"
            f"  {p50(r['client_send_us']):>11}  {spans:>25}  {p50(r['client_answer_us']):>6}"
            f"  {p50(r['server_wait_us']):>11}  {p50(r['wake_to_run_us']):>8}"
        )
    return "\n".join(rows)


@click.command("trace")
@click.option(
    "--system",
    multiple=True,
    default=("streamwal_async", "redis", "nats"),
    show_default=True,
    help="Systems to trace, as named by `bench compare` (repeatable).",
)
@click.option("--rounds", default=3, show_default=True, help="Rounds per system, in turns.")
@click.option("--seconds", default=5.0, show_default=True, help="Length of each round.")
@click.option(
    "--window", default=2.0, show_default=True, help="Seconds of each round under the trace."
)
def trace(system: tuple[str, ...], rounds: int, seconds: float, window: float) -> None:
    """Where a one-at-a-time send's latency goes: server, client, wake-ups (needs root).

    Open-loop sends at 1000 msg/s, as `bench compare` measures latency, with the
    kernel's scheduler events traced; prints a table, then one JSON object.
    """
    import uvloop
    from tqdm import tqdm

    from streamwal.bench.compare import PEERS, make_systems

    names = system
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise click.BadParameter(f"unknown: {', '.join(unknown)} (one of {', '.join(PEERS)})")
    plan = dataclasses.replace(
        wl.Plan.named("full"), latency_rounds=rounds, latency_seconds=seconds
    )
    systems = make_systems(names)
    with tqdm(total=rounds * len(systems), file=sys.stderr, unit="round", leave=False) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        results = uvloop.run(trace_rounds(systems, plan, min(window, seconds), tick))
    click.echo(_table(results))
    click.echo(json.dumps({"systems": results}))
