"""`streamwal broadcast list` and `streamwal broadcast ack ID`: the broadcasts the coord
keeps and the resource keys they hold, and a way to release them by hand (a consumer
that was to ack them is gone; an example left a key held)."""

from __future__ import annotations

import asyncio
import json as _json
import time

import click

from streamwal.cli import coord_option


@click.group("broadcast")
def broadcast() -> None:
    """Broadcasts (one message to many vchannels) and their resource keys."""


async def _call(coord: str, method: str, request):
    from grpc import aio

    from streamwal import transport
    from streamwal.grpc_errors import from_trailing
    from streamwal.proto import broadcast_pb2_grpc as bpbg

    async with transport.make_channel(coord) as ch:
        stub = bpbg.StreamingCoordBroadcastServiceStub(ch)
        try:
            return await getattr(stub, method)(request, timeout=30)
        except aio.AioRpcError as err:
            typed = from_trailing(err.trailing_metadata())
            raise click.ClickException(str(typed) if typed else err.details()) from None


def _tasks(coord: str, include_tombstones: bool):
    from streamwal.proto import broadcast_pb2 as bpb

    request = bpb.ListBroadcastsRequest(include_tombstones=include_tombstones)
    return asyncio.run(_call(coord, "ListBroadcasts", request)).tasks


def _key(k) -> str:
    return f"{k.domain}:{k.key}" + (" (shared)" if k.shared else "")


@broadcast.command("list")
@coord_option()
@click.option("--all", is_flag=True, help="Also the finished ones (acked everywhere).")
@click.option("--json", is_flag=True, help="One JSON object per broadcast.")
def list_(coord: str, all: bool, json: bool) -> None:
    """Broadcasts not yet acked on every vchannel (they hold their resource keys), oldest
    first: id, state, keys held, vchannels still to ack, age."""
    from google.protobuf.json_format import MessageToDict

    from streamwal.proto import broadcast_pb2 as bpb

    tasks = _tasks(coord, all)
    if json:
        for t in tasks:
            click.echo(_json.dumps(MessageToDict(t, preserving_proto_field_name=True)))
        return
    rows = [("ID", "STATE", "KEYS", "UNACKED", "AGE_S")]
    now_ms = time.time() * 1000
    for t in tasks:
        unacked = [v.vchannel for v in t.vchannels if not v.acked]
        rows.append(
            (
                str(t.broadcast_id),
                bpb.BroadcastTaskState.Name(t.state).removeprefix("BROADCAST_TASK_STATE_").lower(),
                ",".join(_key(k) for k in t.resource_keys) or "-",
                ",".join(unacked) or "-",
                f"{max(0.0, (now_ms - t.created_at_ms) / 1000):.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@broadcast.command("ack")
@coord_option()
@click.argument("broadcast_id", type=click.IntRange(1))
@click.argument("vchannels", nargs=-1)
def ack(coord: str, broadcast_id: int, vchannels: tuple[str, ...]) -> None:
    """Ack broadcast BROADCAST_ID on VCHANNELS (default: every one not acked yet): once
    acked everywhere, its resource keys are released."""
    from streamwal.proto import broadcast_pb2 as bpb

    if not vchannels:
        found = [t for t in _tasks(coord, True) if t.broadcast_id == broadcast_id]
        if not found:
            raise click.ClickException(f"no broadcast {broadcast_id} (streamwal broadcast list)")
        vchannels = tuple(v.vchannel for v in found[0].vchannels if not v.acked)

    async def ack_all() -> None:
        for v in vchannels:
            request = bpb.BroadcastAckRequest(broadcast_id=broadcast_id, vchannel=v)
            await _call(coord, "Ack", request)

    asyncio.run(ack_all())
    click.echo(f"broadcast {broadcast_id}: acked on {len(vchannels)} vchannel(s)")
