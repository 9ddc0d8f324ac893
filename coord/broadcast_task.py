"""The life of one broadcast task, as pure functions over its persisted record.

    PENDING ──(appended to every vchannel)──▶ DONE ──(acked on every vchannel)──▶ TOMBSTONE

A task is written to the meta store before anything is appended, and after every step,
so a restarted coord resumes from the record alone. Copies go out one batch per target
pchannel (all the task's vchannels on that pchannel, sorted, in one atomic batch), so a
pchannel is either wholly appended or not at all. Acks may arrive before the coord learns
that an append landed (its answer was lost in a crash): they are kept, and a task whose
every vchannel is appended and acked is a tombstone. Tombstones answer retries (same
request id) and late acks for a while; `prunable` bounds how many stay and how long.

The coord's broadcaster (`broadcaster.py`) does the I/O; nothing here waits or writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streamwal.errors import InvalidArgument
from streamwal.ids import encode_offset
from streamwal.message import PROP_BROADCAST_ID, PROP_VCHANNEL, ResourceKey
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import streaming_pb2 as pb
from streamwal.protowire import message_properties

PENDING = bpb.BROADCAST_TASK_STATE_PENDING
DONE = bpb.BROADCAST_TASK_STATE_DONE
TOMBSTONE = bpb.BROADCAST_TASK_STATE_TOMBSTONE
STATES = {PENDING: "pending", DONE: "done", TOMBSTONE: "tombstone"}

MAX_VCHANNELS = 1024


def state_name(task: bpb.BroadcastTask) -> str:
    return STATES.get(task.state, "unknown")


def _copy(task: bpb.BroadcastTask) -> bpb.BroadcastTask:
    out = bpb.BroadcastTask()
    out.CopyFrom(task)
    return out


def new_task(
    broadcast_id: int,
    request_id: str,
    message: pb.Message,
    targets: Mapping[str, str],
    keys: Iterable[ResourceKey],
    now_ms: int,
) -> bpb.BroadcastTask:
    """A PENDING task for `targets` ({vchannel: pchannel}); bad input raises InvalidArgument."""
    if not request_id:
        raise InvalidArgument("request_id is required (a unique token per broadcast)")
    if not targets:
        raise InvalidArgument("a broadcast needs at least one vchannel")
    if len(targets) > MAX_VCHANNELS:
        raise InvalidArgument(f"at most {MAX_VCHANNELS} vchannels per broadcast")
    try:  # user properties may not use reserved keys (the coord sets _vc and _bid)
        message_properties(None, None, dict(message.properties))
    except ValueError as err:
        raise InvalidArgument(str(err)) from None
    if PROP_VCHANNEL in message.properties:
        raise InvalidArgument(f"property {PROP_VCHANNEL!r} is set by the coord for each vchannel")
    task = bpb.BroadcastTask(
        broadcast_id=broadcast_id,
        request_id=request_id,
        message=message,
        state=PENDING,
        created_at_ms=now_ms,
        resource_keys=[bpb.ResourceKey(domain=k.domain, key=k.key, shared=k.shared) for k in keys],
    )
    for vchannel in sorted(targets):
        task.vchannels.add(vchannel=vchannel, pchannel=targets[vchannel])
    return task


def resource_keys(task: bpb.BroadcastTask) -> list[ResourceKey]:
    return [ResourceKey(k.domain, k.key, k.shared) for k in task.resource_keys]


def pending_pchannels(task: bpb.BroadcastTask) -> dict[str, list[str]]:
    """{pchannel: its vchannels, sorted} for every pchannel not yet appended."""
    out: dict[str, list[str]] = {}
    for v in task.vchannels:
        if not v.appended:
            out.setdefault(v.pchannel, []).append(v.vchannel)
    return out


def copies(task: bpb.BroadcastTask, pchannel: str) -> list[tuple[str, dict[str, str]]]:
    """The messages of `pchannel`'s batch, in order: (vchannel, properties) for each."""
    base = dict(task.message.properties)
    base[PROP_BROADCAST_ID] = str(task.broadcast_id)
    return [
        (v.vchannel, {**base, PROP_VCHANNEL: v.vchannel})
        for v in task.vchannels
        if v.pchannel == pchannel
    ]


def _settle(task: bpb.BroadcastTask, now_ms: int) -> None:
    if task.state == PENDING and all(v.appended for v in task.vchannels):
        task.state = DONE
    if task.state == DONE and all(v.acked for v in task.vchannels):
        task.state = TOMBSTONE
        task.tombstoned_at_ms = now_ms


def record_appended(
    task: bpb.BroadcastTask, pchannel: str, first_offset: int, first_tick: int, now_ms: int
) -> bpb.BroadcastTask:
    """`pchannel`'s batch landed at (first_offset, first_tick): its copies are i = 0, 1, ..."""
    out = _copy(task)
    index = 0
    for v in out.vchannels:
        if v.pchannel == pchannel:
            v.appended = True
            v.message_id.id = encode_offset(first_offset + index)
            v.time_tick = first_tick + index
            index += 1
    if not index:
        raise InvalidArgument(f"broadcast {task.broadcast_id} has no vchannel on {pchannel!r}")
    _settle(out, now_ms)
    return out


def record_ack(task: bpb.BroadcastTask, vchannel: str, now_ms: int) -> bpb.BroadcastTask | None:
    """The task with `vchannel` acked; None when it already was (nothing to write)."""
    out = _copy(task)
    for v in out.vchannels:
        if v.vchannel == vchannel:
            if v.acked:
                return None
            v.acked = True
            _settle(out, now_ms)
            return out
    raise InvalidArgument(
        f"vchannel {vchannel!r} is not a target of broadcast {task.broadcast_id} "
        f"(targets: {', '.join(v.vchannel for v in task.vchannels)})"
    )


def acked_once(task: bpb.BroadcastTask) -> bool:
    return task.state == TOMBSTONE or any(v.acked for v in task.vchannels)


def holds_keys(task: bpb.BroadcastTask) -> bool:
    return task.state != TOMBSTONE


def prunable(
    tasks: Iterable[bpb.BroadcastTask], now_ms: int, keep: int, max_age_ms: int
) -> list[int]:
    """Tombstones to delete: older than `max_age_ms`, or beyond the newest `keep`.

    The task with the highest id is never pruned: it is where the next id is counted from
    after a restart, and an id must never be reused (node-side idempotent producers are
    named after it).
    """
    tasks = list(tasks)
    if not tasks:
        return []
    highest = max(t.broadcast_id for t in tasks)
    tombs = sorted(
        (t for t in tasks if t.state == TOMBSTONE and t.broadcast_id != highest),
        key=lambda t: t.broadcast_id,
        reverse=True,
    )
    return sorted(
        t.broadcast_id
        for i, t in enumerate(tombs)
        if i >= keep or now_ms - t.tombstoned_at_ms > max_age_ms
    )


def response(task: bpb.BroadcastTask) -> bpb.BroadcastResponse:
    return bpb.BroadcastResponse(broadcast_id=task.broadcast_id, results=list(task.vchannels))
