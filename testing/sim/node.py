"""A simulated streaming node: the real per-pchannel cores, driven over a simulated disk.

`SimNode` plays the part `Wal` plays in a real node -- it applies the cores' effects and
runs their steps -- with a `Disk` that keeps what was durably written (and loses what was
in flight on a crash), a group committer, follower streams pulled from the leader, and
the node's RPCs: Assign, Fence, Remove, CollectStatus, Produce, Read, Fetch and the
replication pull. Records are the real encoded records (node/records.py) of real
MessageBatches, so the history checker reads the disk as it reads a node.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from streamwal.errors import DataLoss, Inner, StreamingError, Unavailable
from streamwal.message import PROP_TYPE, MsgType
from streamwal.node import core as nc
from streamwal.node import records
from streamwal.node.channel_meta import ChannelMeta, Tail
from streamwal.node.divergence import log_divergence
from streamwal.node.fencing import AssignOutcome
from streamwal.node.producers import window_below
from streamwal.node.replication_rules import Rejected
from streamwal.node.steps import drive
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.testing.sim.cluster import Cluster

T = TypeVar("T")
TICK_BODY = pb.MessageBatch(
    messages=[pb.Message(properties={PROP_TYPE: str(int(MsgType.TimeTick))})]
).SerializeToString()
PULL_RECORDS = 8  # records per replication pull (small: acks interleave with the stream)


@dataclass
class Disk:
    """What a node holds durably. Survives crashes; writes in flight at a crash are lost."""

    metas: dict[str, ChannelMeta] = field(default_factory=dict)
    logs: dict[str, dict[int, bytes]] = field(default_factory=dict)  # name -> base -> record
    windows: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)
    ledger: dict[str, int] = field(default_factory=dict)  # acknowledged-offset marks
    failing: bool = False  # the nemesis: every write fails (a full or broken disk)
    slow: float = 0.0  # the nemesis: every write takes up to this much longer (fsync stalls)

    def bases(self, name: str) -> list[int]:
        return sorted(self.logs.get(name, {}))

    def tail(self, name: str) -> Tail:
        log = self.logs.get(name, {})
        if not log:
            return Tail(0, 0, 0, 0, 0)
        bases = sorted(log)
        last = records.decode(log[bases[-1]])
        size = sum(len(v) for v in log.values())
        return Tail(bases[0], bases[-1] + last.count, last.last_tick, size, last.term)

    def records_from(self, name: str, offset: int, end: int, limit: int) -> list[tuple[int, bytes]]:
        """Records holding offsets in [offset, end), from the one holding `offset`."""
        log = self.logs.get(name, {})
        bases = sorted(log)
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        out = []
        for base in bases[i:]:
            if base >= end or len(out) >= limit:
                break
            if base + records.peek(log[base])[2] > offset:
                out.append((base, log[base]))
        return out

    def truncate(self, name: str, offset: int) -> tuple[int, int]:
        """Drop the records from `offset`; returns (bytes dropped, last term left)."""
        log = self.logs.get(name, {})
        dropped = 0
        for base in [b for b in log if b >= offset]:
            dropped += len(log.pop(base))
        for pid, raw in list(self.windows.get(name, {}).items()):
            self.windows[name][pid] = window_below(raw, offset)
        return dropped, self.tail(name).last_term


class SimNode:
    """One node: cores by pchannel over a Disk; its tasks die with it on a crash."""

    def __init__(self, cluster: Cluster, node_id: int) -> None:
        self.cluster = cluster
        self.id = node_id
        self.address = f"sim-node-{node_id}"
        self.disk = Disk()
        self.cores: dict[str, nc.PChannelCore] = {}
        self._up = False
        self._running = asyncio.Event()
        self._running.set()
        self._tasks: dict[asyncio.Task, None] = {}  # ordered: a crash cancels in order
        self._queue: list[_Write] = []
        self._queued = asyncio.Event()
        self._events: dict[str, list[asyncio.Future]] = {}  # name -> its waiters
        self._waiters: dict[int, asyncio.Future] = {}
        self._tokens = 0
        self._pending: dict[tuple[str, tuple[str, int]], asyncio.Future] = {}
        self._following: dict[str, tuple[nc.Following, asyncio.Task]] = {}
        self._writing: dict[str, asyncio.Future] = {}
        self._sent: dict[tuple[str, int], int] = {}  # (pchannel, follower) -> position sent
        self._told: dict[tuple[str, int], int] = {}  # (pchannel, follower) -> commit sent
        self.restarts = 0
        self._read_at: dict[str, float] = {}  # pchannel -> when a consumer last read it

    # ----------------------------------------------------------------- process

    @property
    def up(self) -> bool:
        return self._up

    async def awake(self) -> None:
        await self._running.wait()

    def spawn(self, work: Awaitable[T]) -> asyncio.Task[T]:
        """A task of this process: a crash ends it; dying of a bug fails the run. A dead
        process starts nothing (a request that waited out a pause finds it dead)."""
        if not self._up:
            if asyncio.iscoroutine(work):
                work.close()
            raise Unavailable(f"node {self.id} is down")
        task: asyncio.Task[T] = asyncio.ensure_future(work)
        self._tasks[task] = None
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, StreamingError | Rejected):
            self.cluster.fail(f"node {self.id}: {exc!r}")

    def start(self) -> None:
        """Start (or restart on the same disk): every pchannel recovering until assigned."""
        self._up = True
        self._running.set()
        for name in sorted(self.disk.metas):
            self.cores[name] = self._core(name, self.disk.metas[name], known=True)
        self.spawn(self._commit_loop())
        self.spawn(self._tick_loop())

    def crash(self) -> None:
        """SIGKILL: every task ends, memory is gone, the disk keeps what was written."""
        self._up = False
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self.cores.clear()
        self._queue.clear()
        self._events.clear()
        self._waiters.clear()
        self._pending.clear()
        self._following.clear()
        self._writing.clear()
        self._sent.clear()
        self._told.clear()
        self.restarts += 1

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def _core(self, name: str, meta: ChannelMeta, known: bool) -> nc.PChannelCore:
        windows = self.disk.windows.setdefault(name, {})
        return nc.PChannelCore(
            name,
            self.id,
            meta,
            self.disk.tail(name),
            self.disk.commits.get(name),
            load_window=windows.get,
            known=known,
            ledger_mark=self.disk.ledger.get(name, 0),
        )

    def _get(self, name: str) -> nc.PChannelCore:
        core = self.cores.get(name)
        if core is None:
            core = self.cores[name] = self._core(name, ChannelMeta(), known=False)
        return core

    async def _disk(self, apply: Callable[[], T]) -> T:
        """One synced write: it takes the disk's time; a failing disk refuses it."""
        rng = self.cluster.rng
        await asyncio.sleep(
            rng.uniform(*self.cluster.config.disk_latency) + rng.uniform(0, self.disk.slow)
        )
        await self.awake()
        if self.disk.failing:
            raise Inner(f"node {self.id}: storage write failed (simulated)")
        return apply()

    # ----------------------------------------------------------------- effects

    def _notify(self, name: str) -> None:
        for waiter in self._events.pop(name, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def _changed(self, name: str, timeout: float) -> None:
        """Until `name` changes (`_notify`) or `timeout` passes: one future and one timer
        (a wait_for over an Event was a task more per wait, and 20,000 idle followers
        wait at once in the scale run)."""
        waiter = asyncio.get_running_loop().create_future()
        self._events.setdefault(name, []).append(waiter)
        timer = asyncio.get_running_loop().call_later(timeout, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            waiters = self._events.get(name)
            if waiters is not None and waiter in waiters:  # timed out: no longer waiting
                waiters.remove(waiter)
                if not waiters:
                    del self._events[name]

    def _effects(self, core: nc.PChannelCore, effects: list[nc.Effect]) -> None:
        for effect in effects:
            self._effect(core, effect)

    def _effect(self, core: nc.PChannelCore, effect: nc.Effect) -> None:
        name = core.name
        if isinstance(effect, nc.Notify):
            self._notify(name)
        elif isinstance(effect, nc.MarkDurable):
            self.disk.ledger[name] = max(self.disk.ledger.get(name, 0), effect.end)
        elif isinstance(effect, nc.Answer):
            for token in effect.tokens:
                waiter = self._waiters.pop(token, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
        elif isinstance(effect, nc.Fail):
            for token in effect.tokens:
                waiter = self._waiters.pop(token, None)
                if waiter is not None and not waiter.done():
                    waiter.set_exception(effect.error)
        elif isinstance(effect, nc.StartFollowing):
            self._following[name] = (effect.role, self.spawn(self._follow(core, effect.role)))
        elif isinstance(effect, nc.StopFollowing):
            current = self._following.get(name)
            if current is not None and current[0] == effect.role:
                del self._following[name]
                current[1].cancel()
        elif isinstance(effect, nc.AppendTick):
            self._tick(core, effect.term)
        else:
            raise AssertionError(f"a step outside a step runner: {effect!r}")

    async def _steps(self, core: nc.PChannelCore, steps: nc.Steps) -> Any:
        """Run an input's steps: each one's I/O here, its outcome back to the core."""
        return await drive(steps, lambda step: nc.Pending(self._step(core, step)))

    async def _step(self, core: nc.PChannelCore, step: nc.Effect) -> Any:
        name = core.name
        if isinstance(step, nc.PersistMeta):
            meta = replace(step.meta, history=list(step.meta.history))
            await self._disk(lambda: self.disk.metas.__setitem__(name, meta))
        elif isinstance(step, nc.Drain):
            while not core.drained:
                await self._changed(name, 0.05)
        elif isinstance(step, nc.Verify):
            return None
        elif isinstance(step, nc.Truncate):
            if step.divergent:
                mark = self.disk.ledger.get(name, 0)
                self.disk.ledger[name] = min(mark, step.offset)
            return await self._disk(lambda: self.disk.truncate(name, step.offset))
        elif isinstance(step, nc.Store):
            await self._store(core, step)
        elif isinstance(step, nc.CatchUp):
            return await self._catch_up(core, step.source)
        elif isinstance(step, nc.StopFollowing):
            self._effect(core, step)
            writing = self._writing.get(name)
            if writing is not None:  # settle: what the core shows must be durable
                await asyncio.gather(writing, return_exceptions=True)
        else:
            self._effect(core, step)
        return None

    async def _store(self, core: nc.PChannelCore, step: nc.Store) -> None:
        name = core.name

        def apply() -> None:
            log = self.disk.logs.setdefault(name, {})
            for base, value in step.records:
                log[base] = value
            self.disk.metas[name] = replace(step.meta, history=list(step.meta.history))
            self.disk.windows.setdefault(name, {}).update(step.windows)
            if step.commit is not None:
                self.disk.commits[name] = step.commit

        # The write goes on if the follower stream is cancelled (settled by a fence), and
        # a failure is undone whoever still waits for it.
        write = self.spawn(self._disk(apply))
        staged = step.staged
        if staged is not None:
            write.add_done_callback(
                lambda w: w.cancelled() or w.exception() is None or core.unstore(staged)
            )
        self._writing[name] = write
        await asyncio.shield(write)

    # ----------------------------------------------------------------- appends

    def _append(
        self,
        core: nc.PChannelCore,
        term: int,
        body: bytes,
        count: int,
        flags: int = 0,
        producer: tuple[str, int] | None = None,
    ) -> asyncio.Future:
        """Accept and queue a record; the future resolves to (base, first tick) once
        durable. Raises the core's refusal; a Resend answers from the original."""
        got = core.append(term, count, self._now_ms(), flags, producer)
        if isinstance(got, nc.Resend):
            pending = self._pending.get((core.name, producer)) if got.in_flight else None
            if pending is not None:
                return pending
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            done.set_result((got.result.base, got.result.first_tick))
            return done
        value = records.encode(term, got.first_tick, count, body, flags, producer)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        if producer is not None:
            self._pending[(core.name, producer)] = future
        self._queue.append(_Write(core, got.base, count, value, producer, future))
        self._queued.set()
        return future

    async def _commit_loop(self) -> None:
        """The group committer: everything queued meanwhile goes into one synced write."""
        while True:
            await self._queued.wait()
            self._queued.clear()
            await self.awake()
            group, self._queue = self._queue, []
            if not group:
                continue
            try:
                await self._disk(lambda g=group: self._write(g))
            except StreamingError as err:
                self._failed(group, err)
                continue
            for item in group:
                core = item.core
                self._pending.pop((core.name, item.producer), None)
                if self.cores.get(core.name) is not core:
                    continue
                term = records.peek(item.value)[0]
                written = core.written(
                    item.base, item.count, len(item.value), term, item.producer, True
                )
                self._effects(core, written)
                if not item.future.done():
                    item.future.set_result((item.base, records.peek(item.value)[1]))

    def _write(self, group: list[_Write]) -> None:
        for item in group:
            name = item.core.name
            self.disk.logs.setdefault(name, {})[item.base] = item.value
            if item.producer is not None:
                pid, seq = item.producer
                window = item.core.producers[pid].encode_upto(seq)
                self.disk.windows.setdefault(name, {})[pid] = window
            if item.core.commit is not None:
                self.disk.commits[name] = item.core.commit

    def _failed(self, group: list[_Write], err: StreamingError) -> None:
        """A failed write fails its group and everything queued behind it; the cores
        rewind to what is durable."""
        group = group + self._queue
        self._queue = []
        cores: dict[str, nc.PChannelCore] = {}
        for item in group:
            cores[item.core.name] = item.core
            self._pending.pop((item.core.name, item.producer), None)
            if not item.future.done():
                item.future.set_exception(err)
        for name, core in cores.items():
            producers = [i.producer for i in group if i.core is core and i.producer]
            if self.cores.get(name) is core:
                self._effects(core, core.write_failed(producers))

    async def _tick_loop(self) -> None:
        """Idle time ticks keep quiet pchannels' time moving for their readers: as the
        node's (Wal._tick_idle_channels), only pchannels with a reader, here one that
        read within two intervals (the simulated consumers poll and see the ticks)."""
        interval = self.cluster.config.tick_interval
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval / 2)
            await self.awake()
            now = self._now_ms()
            for name, at in list(self._read_at.items()):
                core = self.cores.get(name)
                if core is None or loop.time() - at > 2 * interval:
                    del self._read_at[name]
                elif core.idle(now, int(interval * 1000)):
                    try:
                        self._tick(core, core.term)
                    except StreamingError:
                        continue

    def _tick(self, core: nc.PChannelCore, term: int) -> None:
        """A time tick record; nobody waits for its answer (a failed one is just gone)."""
        done = self._append(core, term, TICK_BODY, 1, records.FLAG_TIME_TICK)
        done.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _now_ms(self) -> int:
        return int(self.cluster.wall() * 1000)

    # ----------------------------------------------------------------- RPCs: coord

    async def assign(
        self,
        name: str,
        term: int,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
        retention: pb.RetentionPolicy | None = None,
    ) -> AssignOutcome:
        core = self._get(name)
        rs = nc.parse_replica_set(replica_set, self.id)
        policy = (retention.max_age_ms, retention.max_bytes) if retention is not None else None
        try:
            return await self._steps(
                core,
                core.assign(
                    term,
                    rs,
                    catch_up_from,
                    min_next_offset,
                    retention=policy,
                    accept_data_loss=accept_data_loss,
                ),
            )
        except StreamingError:
            if not core.known and self.cores.get(name) is core:
                del self.cores[name]  # never assigned here: leave no trace of the attempt
            raise

    async def fence(self, name: str, term: int) -> pb.FenceResponse:
        core = self._get(name)
        last_term, end, commit, damage = await self._steps(core, core.fence_term(term))
        return pb.FenceResponse(
            last_term=last_term, next_offset=end, commit_offset=commit, data_loss=damage
        )

    async def remove(self, name: str, term: int) -> None:
        core = self.cores.get(name)
        if core is None:
            core = self._get(name)
        await self._steps(core, core.remove(term))

    async def collect_status(self) -> pb.StreamingNodeManagerCollectStatusResponse:
        out = pb.StreamingNodeManagerCollectStatusResponse(
            server_id=self.id, wall_time_ms=int(self.cluster.wall() * 1000)
        )
        for core in self.cores.values():
            if core.known and core.reported:
                out.channels.append(core.status())
        return out

    # ----------------------------------------------------------------- RPCs: clients

    async def produce(
        self, name: str, term: int, producer: tuple[str, int], body: bytes, count: int
    ) -> tuple[int, int]:
        """Append a producer's batch; answered once durable and, replicated, committed."""
        core = self.cores.get(name)
        if core is None:
            raise Unavailable(f"node {self.id} does not know {name!r}")
        quorum = isinstance(core.role, nc.Leading) and len(core.role.members) > 1
        base, first_tick = await self._append(core, term, body, count, producer=producer)
        if quorum and self.cores.get(name) is core:
            self._tokens += 1
            token = self._tokens
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[token] = waiter
            self._effects(core, core.wait_commit(term, base + count, token))
            await waiter
        return base, first_tick

    async def read(self, name: str, term: int, offset: int) -> list[tuple[int, bytes]]:
        """What a consumer under `term` may see from `offset` (committed records)."""
        core = self.cores.get(name)
        if core is None:
            raise Unavailable(f"node {self.id} does not know {name!r}")
        core.access(term)
        self._read_at[name] = asyncio.get_running_loop().time()
        return self.disk.records_from(name, offset, core.visible_next, 16)

    async def fetch(self, name: str, offset: int) -> tuple[list, int, list[tuple[int, bytes]]]:
        """For a catch-up: the term history, the log end and the durable records from
        `offset` (any role, any fence); a log lacking acknowledged records refuses."""
        core = self.cores.get(name)
        if core is None:
            if name not in self.disk.metas:
                raise Unavailable(f"node {self.id} holds no log of {name!r}")
            core = self.cores[name] = self._core(name, self.disk.metas[name], known=True)
        if core.damage:
            raise DataLoss(f"pchannel {name!r} lost acknowledged records: {core.damage}")
        got = self.disk.records_from(name, offset, core.committed_next, 1 << 30)
        return list(core.meta.history), core.committed_next, got

    async def _catch_up(self, core: nc.PChannelCore, source: str) -> StreamingError | None:
        node = self.cluster.node_by_address(source)
        if node is None:
            return Inner(f"cannot catch up {core.name!r}: unknown source {source}")
        net, name = self.cluster.net, core.name
        try:
            history, end, _ = await net.call(
                self.id, node.id, lambda: node.fetch(name, 0), 2.0, "fetch"
            )
            cut = log_divergence(core.meta.history, core.next_offset, history, end)
            if cut is not None:
                await self._steps(core, core.truncate(cut))
            _, _, got = await net.call(
                self.id, node.id, lambda: node.fetch(name, core.next_offset), 2.0, "fetch"
            )
        except StreamingError as err:
            cls = DataLoss if isinstance(err, DataLoss) else Inner
            return cls(f"cannot catch up {name!r} from {source}: {err}")
        if got:
            try:
                await self._steps(core, core.store(got))
            except StreamingError as err:
                return Inner(f"cannot catch up {name!r} from {source}: {err}")
        return None

    # ----------------------------------------------------------------- replication

    async def pull(
        self, name: str, term: int, follower: int, acked: int, history: list | None
    ) -> list[nc.Entry]:
        """A follower's pull: its acknowledgement and the next entries (the first pull
        carries its history: where the logs part, the leader tells it to cut)."""
        core = self.cores.get(name)
        if core is None or not isinstance(core.role, nc.Leading):
            raise Unavailable(f"pchannel {name!r} is not led by node {self.id}")
        truncate = None
        if history is not None:
            start = core.open_stream(follower, term, history, acked)
            position, truncate = start.position, start.truncate_from
        else:
            sent = self._sent.get((name, follower), acked)
            self._effects(core, core.acked(follower, term, acked, sent))
            position = acked
        told = self._told.get((name, follower))
        # Nothing new to send (no record, no cut, no commit the follower does not know):
        # wait, as a leader's stream waits, for the next record or commit offset.
        if position >= core.committed_next and truncate is None and told == core.known_commit:
            await self._changed(name, self.cluster.config.pull_wait)
        got = self.disk.records_from(name, position, core.committed_next, PULL_RECORDS)
        got = [(b, v) for b, v in got if b >= position]
        self._sent[(name, follower)] = got[-1][0] + records.peek(got[-1][1])[2] if got else position
        commit = self._told[(name, follower)] = core.known_commit
        entries = [nc.Entry(core.term, truncate_from=truncate, commit_offset=commit)]
        entries += [nc.Entry(core.term, b, v, commit_offset=commit) for b, v in got]
        return entries

    async def _follow(self, core: nc.PChannelCore, role: nc.Following) -> None:
        """Pull from the leader while the role lasts, reconnecting with backoff."""
        leader = self.cluster.node_by_address(role.leader.address)
        first = True
        while leader is not None:
            await self.awake()
            history = list(core.meta.history) if first else None
            acked = core.committed_next
            try:
                entries = await self.cluster.net.call(
                    self.id,
                    leader.id,
                    lambda h=history, a=acked: leader.pull(core.name, role.term, self.id, a, h),
                    self.cluster.config.pull_timeout,
                    "pull",
                )
                first = False
                await self._steps(core, core.apply(entries))
            except (StreamingError, Rejected):
                first = True
                await asyncio.sleep(0.05)


def _release(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class _Write:
    core: nc.PChannelCore
    base: int
    count: int
    value: bytes
    producer: tuple[str, int] | None
    future: asyncio.Future
