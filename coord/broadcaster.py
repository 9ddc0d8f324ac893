"""The coord's broadcaster: records broadcast tasks, appends them everywhere, tracks acks.

A broadcast is written to the meta store (PENDING) before its first copy goes out; then
one runner per task appends a batch to every target pchannel until each succeeds,
following the coord's own assignment across moves and failovers. Appends are idempotent:
each task writes through a node producer named `_broadcast-<id>` whose one batch per
pchannel is always sequence 1, so a resend -- after a lost answer, a node restart, or a
coord crash and restart -- is answered with the first append's offsets (the producer
window travels with the records on catch-up) instead of appended again. A coord that
starts resumes every PENDING task it finds.

Decisions live in `broadcast_task` (task states) and `resource_keys` (the lock table);
this module only sequences store writes, node calls and waiters.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from streamwal.client.node_client import NodeClient
from streamwal.coord import broadcast_task as bt
from streamwal.coord import state_machine as sm
from streamwal.coord.meta_store import StoredBroadcast, VersionConflict
from streamwal.coord.resource_keys import ResourceKeyTable, normalize
from streamwal.errors import (
    BroadcastNotFound,
    ChannelNotExist,
    InvalidArgument,
    OnShutdown,
    StreamingError,
    Unavailable,
    is_fencing_error,
)
from streamwal.message import ResourceKey, pchannel_of
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.protowire import encode_entry, encode_properties
from streamwal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streamwal.coord.coordinator import Coordinator

log = logging.getLogger("streamwal.coord.broadcast")

CRASH_ENV = "STREAMWAL_BROADCAST_CRASH_AT"  # tests: persist-pending | append | persist-done
PRODUCER_PREFIX = "_broadcast-"


@dataclass
class BroadcastConfig:
    keep_tombstones: int = 1000  # newest tombstones kept for idempotent retries and late acks
    tombstone_ttl: float = 3600.0  # seconds a tombstone is kept at most
    append_timeout: float = 5.0  # per attempt: open a producer and append one batch
    retry_interval: float = 0.2
    crash_at: str | None = field(default_factory=lambda: os.environ.get(CRASH_ENV) or None)


class BroadcastMetrics:
    def __init__(self, registry) -> None:
        self.tasks = Gauge(
            "streamwal_coord_broadcast_tasks",
            "Broadcast tasks the coord keeps, by state (pending, done, tombstone).",
            ["state"],
            registry=registry,
        )
        self.append_retries = Counter(
            "streamwal_coord_broadcast_append_retries",
            "Failed attempts to append a broadcast to a pchannel (each is retried).",
            registry=registry,
        )

    def count(self, tasks: list[bpb.BroadcastTask]) -> None:
        for state, name in bt.STATES.items():
            self.tasks.labels(name).set(sum(1 for t in tasks if t.state == state))


def _now_ms() -> int:
    return int(time.time() * 1000)


class Broadcaster:
    """Broadcast tasks of one coord; `standby` says why it does not drive them now, if so.

    `held` (set by an embedding that elects one active coord among replicas: the operator)
    keeps `start` from loading and driving tasks on a standby replica.
    """

    def __init__(self, coord: Coordinator, config: BroadcastConfig | None = None) -> None:
        self.coord = coord
        self.config = config or BroadcastConfig()
        self.metrics = BroadcastMetrics(coord.metrics.registry)
        self.keys = ResourceKeyTable()
        self.standby: str | None = "the coord has not started"
        self.held: str | None = None
        self._tasks: dict[int, StoredBroadcast] = {}
        self._by_request: dict[str, int] = {}
        self._next_id = 1
        self._locks: dict[int, asyncio.Lock] = {}
        self._runners: dict[int, asyncio.Task] = {}
        self._changed = asyncio.Condition()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load every task, rebuild the lock table, resume what is PENDING.

        Also after a `stop`: the store is the truth, what this coord held in memory is
        dropped (another replica may have driven the tasks meanwhile).
        """
        if self.held is not None:
            self.standby = self.held
            return
        stored = await self.coord.store.list_broadcasts()
        self._tasks, self._by_request, self._locks = {}, {}, {}
        self.keys = ResourceKeyTable()
        self._next_id = 1
        for s in stored:
            bid = s.task.broadcast_id
            self._tasks[bid] = s
            self._by_request[s.task.request_id] = bid
            self._next_id = max(self._next_id, bid + 1)
            if bt.holds_keys(s.task):
                try:
                    self.keys.acquire(bid, bt.resource_keys(s.task))
                except StreamingError as err:  # only if the store was edited by hand
                    log.error("resource keys not restored", extra={"id": bid, "error": str(err)})
        self.standby = None
        pending = [b for b, s in self._tasks.items() if s.task.state == bt.PENDING]
        for bid in pending:
            self._spawn(bid)
        self._count()
        await self._prune()
        log.info("broadcaster started", extra={"tasks": len(self._tasks), "resumed": pending})

    async def stop(self, reason: str = "the coord has stopped") -> None:
        self.standby = reason
        runners, self._runners = list(self._runners.values()), {}
        await cancel_and_wait(runners)
        await self._notify()

    def _check_active(self) -> None:
        # OnShutdown (gRPC UNAVAILABLE): typed, and it says "not served here now, go on".
        if self.standby is not None:
            raise OnShutdown(f"broadcast is not available here: {self.standby}")

    # ----------------------------------------------------------------- requests

    async def broadcast(self, request: bpb.BroadcastRequest) -> bpb.BroadcastResponse:
        """Record, append everywhere, answer; a known request id answers its first task."""
        self._check_active()
        bid = self._by_request.get(request.request_id) if request.request_id else None
        if bid is None:
            bid = await self._record(request)
        return bt.response(await self._wait_appended(request.request_id, bid))

    async def _record(self, request: bpb.BroadcastRequest) -> int:
        keys = normalize(ResourceKey(k.domain, k.key, k.shared) for k in request.resource_keys)
        bid = self._next_id
        task = bt.new_task(
            bid,
            request.request_id,
            request.message,
            self._targets(list(request.vchannels)),
            keys,
            _now_ms(),
        )
        # No await from the conflict check to the reservation: two racing appends cannot
        # both take an exclusive key.
        self.keys.acquire(bid, keys)
        self._next_id += 1
        self._by_request[request.request_id] = bid
        try:
            self._tasks[bid] = await self.coord.store.put_broadcast(task, None)
        except BaseException:
            self.keys.release(bid)
            self._by_request.pop(request.request_id, None)
            await self._notify()
            raise
        self._crash_point("persist-pending", bid)
        log.info(
            "broadcast recorded",
            extra={
                "id": bid,
                "vchannels": list(request.vchannels),
                "keys": [str(k) for k in keys],
            },
        )
        self._count()
        self._spawn(bid)
        return bid

    def _targets(self, vchannels: list[str]) -> dict[str, str]:
        """{vchannel: pchannel}; a name that is a live pchannel targets that pchannel."""
        if len(set(vchannels)) != len(vchannels):
            raise InvalidArgument(f"vchannels named twice in {vchannels}")
        live = {d.channel_name for d in self.coord.describe([])}
        targets, unknown = {}, []
        for vchannel in vchannels:
            pchannel = vchannel if vchannel in live else pchannel_of(vchannel)
            if pchannel not in live:
                unknown.append(vchannel)
            targets[vchannel] = pchannel
        if unknown:
            raise ChannelNotExist(f"no pchannel for vchannel(s) {', '.join(unknown)}")
        return targets

    async def _wait_appended(self, request_id: str, bid: int) -> bpb.BroadcastTask:
        async with self._changed:
            while True:
                self._check_active()
                stored = self._tasks.get(bid)
                if stored is not None and stored.task.state != bt.PENDING:
                    return stored.task
                if stored is None and self._by_request.get(request_id) != bid:
                    raise Unavailable(f"broadcast {bid} could not be recorded; retry")
                await self._changed.wait()

    async def ack(self, broadcast_id: int, vchannel: str) -> None:
        """Mark `vchannel` acked (idempotent); the last ack releases the task's keys."""
        self._check_active()
        async with self._lock(broadcast_id):
            stored = self._tasks.get(broadcast_id)
            if stored is None:
                raise BroadcastNotFound(
                    f"no broadcast {broadcast_id}: never made, or acked everywhere long ago"
                )
            task = bt.record_ack(stored.task, vchannel, _now_ms())
            if task is None:
                return
            await self._put(stored, task)
        log.info(
            "broadcast acked",
            extra={"id": broadcast_id, "vchannel": vchannel, "state": bt.state_name(task)},
        )

    def kept(self, include_tombstones: bool = False) -> list[bpb.BroadcastTask]:
        """The broadcasts kept, oldest first: those not acked everywhere (holding their
        resource keys), and the tombstones too when asked."""
        return [
            s.task
            for _, s in sorted(self._tasks.items())
            if include_tombstones or s.task.state != bt.TOMBSTONE
        ]

    async def wait_resource_key(self, domain: str, key: str, until_all: bool) -> None:
        """Until every broadcast holding (domain, key) now is acked once (or everywhere)."""
        self._check_active()
        holders = self.keys.holders(domain, key)

        def released(bid: int) -> bool:
            stored = self._tasks.get(bid)
            if stored is None:
                return True
            return stored.task.state == bt.TOMBSTONE if until_all else bt.acked_once(stored.task)

        async with self._changed:
            await self._changed.wait_for(lambda: all(released(b) for b in holders))

    # ----------------------------------------------------------------- runners

    def _spawn(self, bid: int) -> None:
        if bid not in self._runners:
            self._runners[bid] = asyncio.create_task(self._run(bid), name=f"broadcast-{bid}")

    async def _run(self, bid: int) -> None:
        try:
            groups = bt.pending_pchannels(self._tasks[bid].task)
            await asyncio.gather(*(self._append_until_done(bid, p) for p in groups))
        finally:
            self._runners.pop(bid, None)

    async def _append_until_done(self, bid: int, pchannel: str) -> None:
        """Append `pchannel`'s batch and persist where it landed, retrying until both worked.

        Any failure retries the whole step: a resend after a failed store write is answered
        by the node's producer window, so it never appends a second copy.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                first, tick = await self._append_once(self._tasks[bid].task, pchannel)
                self._crash_point("append", bid)
                async with self._lock(bid):
                    stored = self._tasks[bid]
                    task = bt.record_appended(stored.task, pchannel, first, tick, _now_ms())
                    await self._put(stored, task)
                break
            except Exception as err:  # a bug or a store error must not strand the task
                self.metrics.append_retries.inc()
                expected = isinstance(err, StreamingError | TimeoutError)
                (log.info if expected else log.exception)(
                    "broadcast append retry",
                    extra={"id": bid, "pchannel": pchannel, "attempt": attempt, "error": str(err)},
                )
                await asyncio.sleep(self.config.retry_interval)
        log.info(
            "broadcast appended",
            extra={"id": bid, "pchannel": pchannel, "offset": first, "attempts": attempt},
        )
        if task.state != bt.PENDING and stored.task.state == bt.PENDING:
            self._crash_point("persist-done", bid)

    async def _append_once(self, task: bpb.BroadcastTask, pchannel: str) -> tuple[int, int]:
        """One attempt on the pchannel's current owner: (first offset, first tick)."""
        meta = self.coord.describe([pchannel])[0].meta
        if meta.state != sm.ASSIGNED:
            raise Unavailable(f"pchannel {pchannel} is not assigned now")
        entries = [
            encode_entry(task.message.payload, encode_properties(props))
            for _, props in bt.copies(task, pchannel)
        ]
        timeout = self.config.append_timeout
        async with NodeClient(meta.node.address) as node:
            try:
                producer = await asyncio.wait_for(
                    node.producer(
                        pchannel,
                        meta.channel.term,
                        producer_id=f"{PRODUCER_PREFIX}{task.broadcast_id}",
                    ),
                    timeout,
                )
                try:
                    return await asyncio.wait_for(producer.send_batch(entries, sequence=1), timeout)
                finally:
                    await producer.abandon()
            except StreamingError as err:
                if is_fencing_error(err):  # our view is stale: have the coord look again
                    self.coord.report_error(meta.channel, err.to_proto())
                raise

    # ----------------------------------------------------------------- store and waiters

    def _lock(self, bid: int) -> asyncio.Lock:
        return self._locks.setdefault(bid, asyncio.Lock())

    async def _put(self, stored: StoredBroadcast, task: bpb.BroadcastTask) -> None:
        bid = task.broadcast_id
        try:
            self._tasks[bid] = await self.coord.store.put_broadcast(task, stored.version)
        except VersionConflict:  # another writer (a second operator replica): take its copy
            await self._reload(bid)
            raise
        if not bt.holds_keys(task):
            self.keys.release(bid)
        self._count()
        await self._notify()
        if task.state == bt.TOMBSTONE and stored.task.state != bt.TOMBSTONE:
            await self._prune()

    async def _reload(self, bid: int) -> None:
        """Re-read one task from the store so the next attempt decides on what is there."""
        for s in await self.coord.store.list_broadcasts():
            if s.task.broadcast_id == bid:
                self._tasks[bid] = s
                return

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _prune(self) -> None:
        cfg = self.config
        tasks = [s.task for s in self._tasks.values()]
        for bid in bt.prunable(tasks, _now_ms(), cfg.keep_tombstones, int(cfg.tombstone_ttl * 1e3)):
            await self.coord.store.delete_broadcast(bid)
            stored = self._tasks.pop(bid)
            self._by_request.pop(stored.task.request_id, None)
            self._locks.pop(bid, None)
        self._count()

    def _count(self) -> None:
        self.metrics.count([s.task for s in self._tasks.values()])

    def _crash_point(self, step: str, bid: int) -> None:
        if self.config.crash_at == step:
            log.warning("crash injected", extra={"step": step, "id": bid})
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
