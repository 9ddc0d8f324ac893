"""`streamwal group list` and `streamwal group describe GROUP`: consumer groups, their
committed offsets and lag, asked of each pchannel's owner through the coord."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import click

from streamwal.cli import coord_option


@click.group("group")
def group() -> None:
    """Consumer groups (`streamwal consume CHANNEL --group NAME` joins one)."""


async def _all(coord: str, channels: tuple[str, ...]):
    """Every group description of `channels` (all assigned pchannels when empty)."""
    from streamwal.client.consumer_group import describe_groups
    from streamwal.client.wal import open_wal

    wal = await open_wal(coord, timeout=10.0)
    try:
        names = list(channels) or sorted(wal.assignments())
        found = await asyncio.gather(*(describe_groups(wal, n) for n in names))
        return [d for per_channel in found for d in per_channel]
    finally:
        await wal.close()


def _run(coord: str, channels: tuple[str, ...]):
    from streamwal.errors import StreamingError

    try:
        return asyncio.run(_all(coord, channels))
    except StreamingError as err:
        raise click.ClickException(str(err)) from None


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@group.command("list")
@coord_option()
@click.option("--channel", multiple=True, help="Only these channels (repeatable).")
@click.option("--json", is_flag=True, help="One JSON object per group and pchannel.")
def list_(coord: str, channel: tuple[str, ...], json: bool) -> None:
    """Every consumer group, per pchannel: members, committed offset, end offset, lag
    (messages from the committed offset to the end, time ticks not counted)."""
    found = _run(coord, channel)
    if json:
        _json_lines(found)
        return
    rows = [("GROUP", "PCHANNEL", "MEMBERS", "COMMITTED", "END", "LAG")]
    for d in sorted(found, key=lambda d: (d.group, d.pchannel)):
        rows.append(
            (d.group, d.pchannel, str(len(d.members)), str(d.committed), str(d.end_offset),
             str(d.lag))
        )  # fmt: skip
    _table(rows)


@group.command("describe")
@coord_option()
@click.argument("name")
@click.option("--channel", multiple=True, help="Only these channels (repeatable).")
@click.option("--json", is_flag=True, help="One JSON object per pchannel.")
def describe(coord: str, name: str, channel: tuple[str, ...], json: bool) -> None:
    """A consumer group on each pchannel it reads: committed offset, end offset, lag,
    ranges waiting for redelivery (ORPHANED), then each member with what it holds
    uncommitted and how long since it was heard from."""
    found = [d for d in _run(coord, channel) if d.group == name]
    if not found:
        raise click.ClickException(f"no consumer group {name!r} (streamwal group list)")
    if json:
        _json_lines(found)
        return
    rows = [("PCHANNEL", "COMMITTED", "END", "LAG", "MEMBERS", "ORPHANED")]
    for d in sorted(found, key=lambda d: d.pchannel):
        rows.append(
            (d.pchannel, str(d.committed), str(d.end_offset), str(d.lag), str(len(d.members)),
             str(d.orphaned_ranges))
        )  # fmt: skip
    _table(rows)
    members = [("MEMBER", "PCHANNEL", "UNCOMMITTED_RANGES", "IDLE_S")]
    for d in sorted(found, key=lambda d: d.pchannel):
        for m in d.members:
            members.append(
                (m.consumer_id, d.pchannel, str(m.pending_ranges), f"{m.idle_seconds:.1f}")
            )
    if len(members) > 1:
        click.echo()
        _table(members)


def _json_lines(found) -> None:
    for d in found:
        click.echo(json.dumps(asdict(d)))
