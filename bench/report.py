"""Turns result entries into the ceiling entry, the ratios, the table and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from streamwal.bench.runner import produce_key

HEADLINE = ("produce_msgs_per_s", "produce_p99_ms", "consume_msgs_per_s", "e2e_p99_ms")


def ceiling_entry(noop: dict, rocks: dict[str, dict]) -> dict:
    """Per workload the tighter of the two halves; the transport alone for latency.

    A message must cross gRPC and be written to RocksDB, so neither half alone can be
    beaten; latency has no storage floor here because a group commit shares its fsync.
    """
    produce = {}
    for key, run in noop["produce"].items():
        disk = rocks[f"write_{key}"]["msgs_per_s"]
        produce[key] = {
            "msgs_per_s": min(run["msgs_per_s"], disk),
            "grpc_noop_msgs_per_s": run["msgs_per_s"],
            "rocksdict_msgs_per_s": disk,
        }
    small = min(int(k.split("B_")[0]) for k in produce)
    return {
        "produce_msgs_per_s": max(
            v["msgs_per_s"] for k, v in produce.items() if k.startswith(f"{small}B_")
        ),
        "produce_p50_ms": noop["produce_p50_ms"],
        "produce_p99_ms": noop["produce_p99_ms"],
        "produce_p999_ms": noop["produce_p999_ms"],
        "produce_p99_worst_ms": noop["produce_p99_worst_ms"],
        "produce_after_burst_p99_ms": noop["produce_after_burst_p99_ms"],
        "consume_msgs_per_s": min(
            noop["consume_msgs_per_s"], rocks[f"read_record_{small}B"]["msgs_per_s"]
        ),
        "e2e_p50_ms": noop["e2e_p50_ms"],
        "e2e_p99_ms": noop["e2e_p99_ms"],
        "durability": "throughput: min(no-op gRPC stream, raw rocksdict writes / reads of "
        "the same records, fsync per group of in-flight batches); "
        "latency: no-op gRPC alone",
        "produce": produce,
        "grpc_noop": noop,
        "rocksdict": rocks,
    }


def ratios(
    systems: dict[str, dict], subject: str = "streamwal", peers: Sequence[str] | None = None
) -> dict[str, float]:
    """`subject` (a streamwal run) against each peer and the ceiling, or only against
    `peers` (>1: streamwal is better); streamwal's other runs are not peers."""
    me = systems.get(subject)
    if not me or "error" in me:
        return {}
    out: dict[str, float] = {}
    for name, other in systems.items():
        if name.startswith("streamwal") or "error" in other:
            continue
        if peers is not None and name not in peers:
            continue
        label = "ceiling" if name == "ceiling" else name
        out[f"produce_x_{label}"] = me["produce_msgs_per_s"] / other["produce_msgs_per_s"]
        out[f"consume_x_{label}"] = me["consume_msgs_per_s"] / other["consume_msgs_per_s"]
        out[f"p99_ms_minus_{label}"] = me["produce_p99_ms"] - other["produce_p99_ms"]
    return out


def _k(v: float) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"


def table(systems: dict[str, dict], sizes: tuple[int, ...], producers: tuple[int, ...]) -> str:
    """A fixed-width table (msgs/s and ms), durability of each system underneath."""
    cols = [produce_key(s, p) for s in sizes for p in producers]
    head = [
        "system",
        *[f"prod {c}" for c in cols],
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "p99 worst",
        "p99 after burst",
        "catch-up",
        "e2e p50",
        "e2e p99",
    ]
    rows = [head]
    notes = []
    for name, e in systems.items():
        if "error" in e:
            rows.append([name, f"unavailable: {e['error']}"[:60]])
            continue
        rows.append(
            [
                name,
                *[_k(e["produce"][c]["msgs_per_s"]) if c in e["produce"] else "-" for c in cols],
                f"{e['produce_p50_ms']:.2f}",
                f"{e['produce_p99_ms']:.2f}",
                f"{e['produce_p999_ms']:.2f}",
                f"{e['produce_p99_worst_ms']:.2f}" if "produce_p99_worst_ms" in e else "-",
                f"{e['produce_after_burst_p99_ms']:.2f}"
                if "produce_after_burst_p99_ms" in e
                else "-",
                _k(e["consume_msgs_per_s"]),
                f"{e['e2e_p50_ms']:.2f}",
                f"{e['e2e_p99_ms']:.2f}",
            ]
        )
        notes.append(f"  {name}: {e['durability']}")
        for key, what in (("latency", "interleaved"), ("latency_after_burst", "after-burst")):
            if e.get(key, {}).get("failed"):
                notes.append(
                    f"  {name}: {e[key]['failed']} {what} open-loop sends failed "
                    "(not in its latency percentiles)"
                )
        if "failover" in e:
            fo = e["failover"]
            notes.append(
                f"  {name} failover: leader SIGKILLed {fo['kills']}x, first quorum ack after "
                f"median {fo['median_s']:.2f} s, max {fo['max_s']:.2f} s "
                f"(coord probe {fo['probe_interval_s']} s, grace {fo['grace_s']} s); "
                + (
                    "every acknowledged message read back"
                    if fo.get("history_ok", True)
                    else f"HISTORY BROKEN: {fo['violations']}"
                )
            )
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(widths[i]) if i else c.ljust(widths[i]) for i, c in enumerate(r))
        for r in rows
    ]
    return "\n".join([*lines, "durability (what an ack means):", *notes, *_ratio_lines(systems)])


def _ratio_lines(systems: dict[str, dict]) -> list[str]:
    """One line per streamwal run and peer: produce and catch-up as ratios, p99 as a difference."""
    out = []
    for name, e in systems.items():
        peers = sorted({k.split("_x_", 1)[1] for k in e.get("vs", {}) if "_x_" in k})
        for peer in peers:
            vs = e["vs"]
            out.append(
                f"  {name} vs {peer}: produce {vs[f'produce_x_{peer}']:.2f}x, "
                f"catch-up {vs[f'consume_x_{peer}']:.2f}x, "
                f"p99 {vs[f'p99_ms_minus_{peer}']:+.2f} ms"
            )
    return ["ratios (>1x: streamwal ahead):", *out] if out else []


def out_option(what: str):
    """`--out PNG` of a benchmark that plots `what`: no plot unless asked for (a default
    path wrote over the committed docs/ plots whenever a benchmark ran in a checkout)."""
    return click.option(
        "--out",
        default=None,
        type=click.Path(dir_okay=False),
        help=f"Write a PNG plot of {what} here (docs/ keeps the plot of the current run).",
    )


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only: benchmarks run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, out: Path, title: str, tight: bool = True) -> Path:
    """Title, lay out and write a figure as PNG (folders made), then free it.

    `tight=False` keeps the figure's own margins: a tight layout draws the figure once
    more to measure it (a third of the compare plot's CPU: 0.50 -> 0.34 s)."""
    fig.suptitle(title, fontsize=10)
    if tight:
        fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
    return out


def plot(systems: dict[str, dict], out: Path, title: str) -> Path:
    """Two log-scale bar charts: throughput and latency per system (PNG, Agg backend)."""
    plt = pyplot()
    names = [n for n, e in systems.items() if "error" not in e]
    big = max(
        int(k.split("B_")[0]) for e in systems.values() if "error" not in e for k in e["produce"]
    )
    tput = {
        "produce 128 B": [systems[n]["produce_msgs_per_s"] for n in names],
        f"produce {big} B": [
            max(
                v["msgs_per_s"]
                for k, v in systems[n]["produce"].items()
                if k.startswith(f"{big}B_")
            )
            for n in names
        ],
        "catch-up consume": [systems[n]["consume_msgs_per_s"] for n in names],
    }
    lat = {
        key.removesuffix("_ms").replace("_", " ") + " (ms)": [systems[n][key] for n in names]
        for key in (
            "produce_p50_ms",
            "produce_p99_ms",
            "produce_p999_ms",
            "e2e_p50_ms",
            "e2e_p99_ms",
        )
    }
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    # fixed margins that fit the labels (`save`: a tight layout costs a second drawing)
    fig.subplots_adjust(left=0.06, bottom=0.2, right=0.99, top=0.88, wspace=0.18)
    for ax, series, ylabel in (
        (axes[0], tput, "messages / s (log)"),
        (axes[1], lat, "milliseconds (log)"),
    ):
        width = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")  # names overlapped at 15
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("acknowledged throughput (higher is better)")
    axes[1].set_title("latency, open loop (lower is better)")
    return save(fig, out, title, tight=False)
