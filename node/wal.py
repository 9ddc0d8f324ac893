"""The node's write-ahead log: pchannels over one LogStore, fenced by terms.

The driver of the pchannels' pure cores (core.py, node/README.md): every decision about a
pchannel is its core's; this feeds the inputs, answers the steps (`steps`) and applies
the effects (`effects`) through the LogStore, the group committer, the acknowledged-offset
ledger and the replication streams (replication.py). Also owns the housekeeping tasks:
idle time ticks (so time-tick consumers progress on quiet pchannels), replication
heartbeats, retention, the ledger's sync and the verification of what earlier processes
wrote. All methods run on the event loop; RocksDB writes happen in a worker thread
inside the group committer; reads are short and bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamwal.errors import (
    DataLoss,
    Inner,
    InvalidArgument,
    StreamingError,
)
from streamwal.message import PROP_TYPE, MsgType
from streamwal.node import peer, records, salvage
from streamwal.node.ack_ledger import AckLedger
from streamwal.node.channel import Channel
from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.config import NodeConfig
from streamwal.node.core import (
    Answer,
    AppendTick,
    CatchUp,
    Drain,
    Effect,
    Fail,
    Following,
    MarkDurable,
    Notify,
    Pending,
    PersistMeta,
    Resend,
    StartFollowing,
    Steps,
    StopFollowing,
    Store,
    Truncate,
    Verify,
    parse_replica_set,
)
from streamwal.node.divergence import log_divergence
from streamwal.node.fencing import (
    AssignOutcome,
    check_access,
    decide_remove,
)
from streamwal.node.group_commit import GroupCommitter
from streamwal.node.health import WriteHealth
from streamwal.node.log_store import LogStore, StoreCorruption, StoreUnwritable, log_key
from streamwal.node.metrics import ChannelState, NodeMetrics
from streamwal.node.producers import (
    BatchResult,
    window_below,
    window_end,
)
from streamwal.node.replication import Replication
from streamwal.node.retention import plan_cut
from streamwal.node.steps import drive
from streamwal.node.store_thread import StoreThread
from streamwal.node.synced_writer import SyncedWriter
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.wal")

MAX_NAME_BYTES = 200
READ_BYTES = 4 * 1024 * 1024  # one read step of a consumer or a fetch
VERIFY_STEP_BYTES = 4 * 1024 * 1024  # records checked per step of a verification
LEDGER_SYNC_S = 1.0  # the ledger's marks reach the disk (and, async, the WAL) this often
CEILING_RESERVE = 1 << 16  # async: offsets reserved per durable raise of a ceiling
COPY_BYTES = 8 * 1024 * 1024  # a catch-up syncs what it copied at least this often
_TIME_TICK_BODY = pb.MessageBatch(
    messages=[pb.Message(properties={PROP_TYPE: str(int(MsgType.TimeTick))})]
).SerializeToString()


@dataclass(slots=True)
class _Append:
    channel: Channel
    base: int
    first_tick: int
    count: int
    value: bytes
    accepted_at: float
    future: asyncio.Future
    producer: tuple[str, int] | None = None  # (producer id, batch sequence)
    # Called with `future` once it is done, in the commit's own callback (Wal.append).
    on_done: Callable[[asyncio.Future], None] | None = None
    term: int = 0  # the record's term (the channel's may have moved on meanwhile: a fence)
    flags: int = 0  # the record's flags (records.FLAG_*), for the metrics


@dataclass(slots=True)
class _Truncate:
    channel: Channel
    keep_from: int
    freed: int
    future: asyncio.Future
    producers: list[str]  # producer windows that go with the cut (producers.cut_producers)


class Resent(Exception):
    """An idempotent producer's batch that was accepted before: answer, do not append.

    `pending` is the original's future while it is not durable yet; the answer must wait
    for it, or an acknowledgement could precede durability.
    """

    def __init__(self, result: BatchResult, pending: asyncio.Future | None) -> None:
        super().__init__("resent batch")
        self.result = result
        self.pending = pending


def _run_on_done(item: _Append) -> None:
    """An append's `on_done`, kept from breaking the commit of the rest of its group."""
    if item.on_done is None:
        return
    try:
        item.on_done(item.future)
    except Exception:
        log.exception("an append's completion callback failed")


def _below(recs: list[tuple[int, bytes]], end: int) -> list[tuple[int, bytes]]:
    """Records past `end` may be written but not yet acknowledged or committed."""
    if recs and recs[-1][0] >= end:
        return [(b, v) for b, v in recs if b < end]
    return recs


def _now_ms() -> int:
    """Wall-clock milliseconds: the core's `now_ms` (ticks, producers' last use)."""
    return time.time_ns() // 1_000_000


def validate_name(name: str) -> None:
    raw = name.encode()
    if not raw or len(raw) > MAX_NAME_BYTES or "\0" in name or not name.isprintable():
        raise InvalidArgument(
            f"invalid pchannel name {name!r}: 1..{MAX_NAME_BYTES} printable bytes, no NUL"
        )


class Wal:
    def __init__(self, store: LogStore, config: NodeConfig, metrics: NodeMetrics) -> None:
        self.store = store
        # The one thread that writes the WAL off the loop (group commits, synced writes,
        # cuts, async durability's syncs): a write never overlaps the WAL's fsync.
        self.writer = StoreThread()
        self.synced = SyncedWriter(store, self.writer)  # metas, copied records, coalesced
        self.config = config
        self.metrics = metrics
        self.channels: dict[str, Channel] = {}
        self.ledger = AckLedger(store.path)
        self._slot_sync: asyncio.Future[None] | None = None  # `_slots_durable`
        self._verifying: dict[str, asyncio.Future] = {}
        self._syncing: asyncio.Future | None = None
        self.write_health = WriteHealth()
        self._committer = GroupCommitter(
            store,
            self.writer,
            self._prepare,
            self._committed,
            self._failed,
            metrics.fsync_latency.observe,
        )
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._tick_wanted: dict[str, Channel] = {}  # pchannels with readers taking ticks
        self.replication = Replication(self, config.node_id)
        # Called with (channel, first offset to keep) before retention cuts below it, so
        # node bookkeeping held in records (consumer-group cursors) can be appended again
        # first: the retained log must always hold it for a node that catches up from it.
        self.before_cut: Callable[[Channel, int], Awaitable[None]] | None = None
        metrics.watch_channels(self._channel_states)

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Load every known pchannel: meta plus two seeks each, never a scan of the log.

        Each log end is checked against the acknowledged-offset ledger: a log that ends
        below what this node acknowledged lost records (RocksDB's WAL recovery drops a
        damaged record and all after it silently), and a pchannel the ledger knows but
        the store does not lost its meta. Either is marked damaged, never served as is.
        What earlier processes wrote is verified (checksums) before this node leads it.
        """
        if not self.ledger.existed and self.store.channel_names():
            log.warning(
                "no acknowledged-offset ledger beside an existing store: starting one from "
                "the current log ends (losses before now cannot be detected)",
                extra={"ledger": str(self.ledger.path)},
            )
        for name in self.store.channel_names():
            meta = self.store.load_meta(name)
            if meta is None:
                continue
            self._load_channel(name, meta)
        for name in self.ledger.names():
            if name in self.channels:
                continue
            if self.ledger.untouched(name) and self.store.tail(name).next_offset == 0:
                # Nothing acknowledged, nothing stored: an Assign that failed after the
                # slot was made (a full disk, say). Not a loss; the pchannel is unknown.
                log.info("ledger slot of a pchannel never served here: ignored",
                         extra={"pchannel": name})  # fmt: skip
                continue
            ch = self._load_channel(name, ChannelMeta())
            lost = "the store has no record of this pchannel (its meta is lost)"
            ch.core.found_damage(ch.first_offset, lost)

    def _channel(
        self, name: str, meta: ChannelMeta, known: bool = True, durable_slot: bool = True
    ) -> Channel:
        """A pchannel's state as the store holds it; its ledger slot made first (durable
        before the pchannel's meta is: a pchannel with meta always has a mark). Without
        `durable_slot` the caller awaits `_slots_durable` before anything else."""
        ch = Channel(
            name,
            meta,
            self.store.tail(name),
            self.store.load_commit(name),
            self.config.node_id,
            functools.partial(self.store.load_producer, name),
            self.ledger.mark(name) or 0,
            known,
        )
        ch.ledger_slot = self.ledger.slot(name, ch.committed_next, durable_slot)
        self.channels[name] = ch
        return ch

    def _load_channel(self, name: str, meta: ChannelMeta) -> Channel:
        ch = self._channel(name, meta)
        ch.unverified_end = ch.committed_next
        ch.core.unverified = bool(ch.unverified_end)
        if ch.core.lost_until:  # the log ends below what the ledger says was acknowledged
            self._found_damage(ch, "ledger")
        ch.ceiling = self.ledger.ceiling(name)
        self._skip_to_ceiling(ch)
        return ch

    def _skip_to_ceiling(self, ch: Channel) -> None:
        """After an unclean stop under async durability the log may end below offsets it
        acknowledged (a power loss takes the last second by design): one internal record
        covers everything up to the ceiling, so those offsets are never handed out again,
        and the log stays dense. Written before the node serves."""
        skip = ch.core.skip(ch.ceiling, _now_ms())
        if skip is None:
            return
        term, got = skip
        end, count = got.base, ch.ceiling - got.base
        flags = records.FLAG_SKIP | records.FLAG_SHARED_TICK
        value = records.encode(term, got.first_tick, count, b"", flags)
        wb = self.store.new_batch()
        self.store.put_record(wb, ch.name, end, value)
        self.store.put_size(wb, ch.name, ch.size_bytes + len(value))
        self.store.write_synced(wb)
        ch.core.written(end, count, len(value), term, None, ledger=False)
        ch.cache(end, count, value)
        log.warning(
            "offsets skipped after an unclean stop under async durability",
            extra={"pchannel": ch.name, "from": end, "to": ch.ceiling - 1},
        )

    def _reserve(self, ch: Channel, end: int) -> None:
        """Async durability: raise a single replica's ceiling above `end` (durably)
        before anything up to `end` is acknowledged."""
        if end > ch.ceiling and ch.commit is None:
            ch.ceiling = end + CEILING_RESERVE
            self.ledger.set_ceiling(ch.ledger_slot, ch.ceiling)

    def start(self) -> None:
        self._committer.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._tick_idle_channels(), name="time-ticks"),
            loop.create_task(self._retention_loop(), name="retention"),
            loop.create_task(self._ledger_loop(), name="ledger-sync"),
            loop.create_task(self._verify_all(), name="verify"),
            loop.create_task(self.replication.beat_loop(), name="replica-heartbeats"),
        ]

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._committer.close()
        await self.synced.close()
        self.replication.close()
        for ch in self.channels.values():
            ch.notify()
        if self._syncing is not None:
            await asyncio.gather(self._syncing, return_exceptions=True)
        for pending in list(self._verifying.values()):
            pending.cancel()
        self.writer.close()
        if not self.store.sync:  # a clean stop: the log ends where it says, no skip
            with contextlib.suppress(StreamingError):
                self.store.sync_wal()
                for ch in self.channels.values():
                    if ch.commit is None and ch.ceiling > ch.committed_next:
                        self.ledger.set_ceiling(ch.ledger_slot, ch.committed_next, durable=False)
        self.ledger.close()

    # -- management --------------------------------------------------------------------

    async def assign(
        self,
        name: str,
        term: int,
        retention: pb.RetentionPolicy | None = None,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
    ) -> AssignOutcome:
        """Serve `name` under `term` (persisted first); `retention` replaces its policy.

        With `catch_up_from` (the previous owner, already fenced) every record this node
        lacks is copied from there first, so the new term continues the same log. With a
        `replica_set` the node leads the replicas or follows its leader (replication.py).

        A log that lacks acknowledged records (`Channel.damage`) is never led: a follower
        drops its damaged suffix and copies it again from its leader; a single replica is
        refused with DataLoss unless `accept_data_loss`, which drops the damaged suffix
        and starts the new term above every offset this node ever acknowledged.
        """
        validate_name(name)
        if retention is not None and (retention.max_age_ms < 0 or retention.max_bytes < 0):
            raise InvalidArgument("retention bounds must be >= 0")
        rs = parse_replica_set(replica_set, self.config.node_id)
        ch = self.channels.get(name) or self._new_channel(name)
        await self._slots_durable(ch)
        policy = None if retention is None else (retention.max_age_ms, retention.max_bytes)
        steps = ch.core.assign(term, rs, catch_up_from, min_next_offset, policy, accept_data_loss)
        outcome = await self._unknown_gone(ch, steps)
        self.replication.lead(ch)
        if outcome is AssignOutcome.TAKE:
            log.info(
                "assigned",
                extra={
                    "pchannel": name,
                    "term": term,
                    "next_offset": ch.next_offset,
                    "role": "follower" if rs is not None and not rs.leading else "leader",
                },
            )
        return outcome

    async def _unknown_gone(self, ch: Channel, steps: Steps) -> Any:
        """Run an Assign's or a Fence's steps; a pchannel never assigned or fenced here
        that fails leaves no trace of the attempt."""
        try:
            return await self.steps(ch, steps)
        except StreamingError:
            self._forget_unknown(ch)
            raise

    def _forget_unknown(self, ch: Channel) -> None:
        """Drop a pchannel never assigned or fenced here from the view (an attempt that
        failed): nothing of it stays but an untouched ledger slot."""
        if not ch.core.known and self.channels.get(ch.name) is ch:
            del self.channels[ch.name]

    def _new_channel(self, name: str) -> Channel:
        """A pchannel this node has no meta for yet, with the node's default retention."""
        meta = ChannelMeta(
            retention_age_ms=self.config.default_retention_age_ms,
            retention_bytes=self.config.default_retention_bytes,
        )
        return self._channel(name, meta, known=False, durable_slot=False)

    async def _slots_durable(self, ch: Channel) -> None:
        """New ledger slots reach the disk before anything of their pchannels does, with
        one sync for every slot allocated before it runs: the items of an Assign or Fence
        batch all allocate theirs before the first of them gets here (their tasks start
        in one turn of the loop, the sync is called soon after). A failed sync leaves no
        trace of a pchannel new here (and is tried again by the next caller)."""
        if not self.ledger.unsynced:
            return
        if self._slot_sync is None:
            loop = asyncio.get_running_loop()
            self._slot_sync = loop.create_future()
            loop.call_soon(self._sync_slots)
        try:
            await asyncio.shield(self._slot_sync)
        except OSError:
            self._forget_unknown(ch)
            raise

    def _sync_slots(self) -> None:
        done, self._slot_sync = self._slot_sync, None
        assert done is not None
        try:
            self.ledger.sync_slots()
        except OSError as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)

    def _tick(self, ch: Channel, term: int) -> None:
        """A time tick record; nobody waits for its answer (a failed one is just gone).
        A new leader's first one commits the older terms' records below it
        (replication_rules.commit_offset), so it does not wait for the idle tick."""
        self.append(ch, term, _TIME_TICK_BODY, 1, records.FLAG_TIME_TICK)

    async def fence(self, name: str, term: int) -> tuple[int, int, int, str]:
        """Raise the accepted term of `name` to `term` (persisted; any lower role ends) and
        report (last record's term, log end, commit offset, damage). A lower or equal term
        only reports. Works whether or not the node serves or even holds the pchannel.

        The log is verified first (once per process): a replica whose log lacks
        acknowledged records says so (it may not lead), and its commit offset then covers
        every offset it acknowledged, so no leader is chosen that lacks them.
        """
        validate_name(name)
        ch = self.channels.get(name) or self._new_channel(name)
        await self._slots_durable(ch)
        before = ch.term
        report = await self._unknown_gone(ch, ch.core.fence_term(term))
        if ch.term > before:
            log.info("fenced", extra={"pchannel": name, "term": term})
        return report

    async def remove(self, name: str, term: int) -> None:
        ch = self.channels.get(name)
        if ch is None:
            decide_remove(None, name, term)  # raises: nothing to remove here
        assert ch is not None
        await self.steps(ch, ch.core.remove(term))
        log.info("removed", extra={"pchannel": name, "term": ch.term})

    def access(self, name: str, term: int) -> Channel:
        """The pchannel if a Produce/Consume under `term` may use it; raises otherwise."""
        ch = self.channels.get(name)
        if ch is None or not ch.core.known:
            check_access(None, name, term)  # raises: never assigned here
        assert ch is not None
        ch.core.access(term)
        return ch

    # -- the core's effects and steps ----------------------------------------------------

    def effects(self, ch: Channel, effects: Iterable[Effect], notify: bool = True) -> None:
        """Apply what the core of `ch` asks for (`notify=False`: the caller notifies)."""
        repl = self.replication
        for effect in effects:
            if isinstance(effect, MarkDurable):
                self.ledger.advance(ch.ledger_slot, effect.end)
            elif isinstance(effect, Notify):
                if notify:
                    ch.notify()
            elif isinstance(effect, Answer):
                repl.answer(effect.tokens)
            elif isinstance(effect, Fail):
                repl.answer(effect.tokens, effect.error)
            elif isinstance(effect, StartFollowing):
                repl.start_following(ch, effect.role)
            elif isinstance(effect, StopFollowing):
                repl.stop_following(ch, effect.role)
            elif isinstance(effect, AppendTick):
                self._tick(ch, effect.term)
            else:
                raise AssertionError(f"a step outside a step runner: {effect!r}")

    async def steps(self, ch: Channel, steps: Steps) -> Any:
        """Run a core input's steps from a task (steps.drive): each one's I/O here."""
        return await drive(steps, self.stepper(ch))

    def stepper(self, ch: Channel) -> Callable[[Effect], Any]:
        """The I/O of `ch`'s steps, for a driver (node/steps.py)."""
        return functools.partial(self._step, ch)

    def _step(self, ch: Channel, step: Effect) -> Any:
        """A step's outcome, or Pending: a synced write's future, or the coroutine of a
        step that waits in its own way."""
        if isinstance(step, Store):
            return Pending(self._store(ch, step))
        if isinstance(step, (PersistMeta, Drain, Verify, Truncate, CatchUp, StopFollowing)):
            return Pending(self._wait(ch, step))
        self.effects(ch, [step])
        return None

    async def _wait(self, ch: Channel, step: Effect) -> Any:
        name = ch.name
        if isinstance(step, PersistMeta):
            await self.synced.save_meta(name, step.meta)
        elif isinstance(step, Drain):
            while not ch.core.drained and not self._closing:
                await ch.wait_changed(0.05)
        elif isinstance(step, Verify):
            await self.ensure_verified(ch)  # what it finds, it reports (report_bad_record)
        elif isinstance(step, Truncate):
            return await self._truncate(ch, step)
        elif isinstance(step, CatchUp):
            return await self._catch_up(ch, step.source)
        elif isinstance(step, StopFollowing):
            self.replication.stop_following(ch, step.role)
            await self.replication.settle(ch)
        return None

    async def _truncate(self, ch: Channel, step: Truncate) -> tuple[int, int]:
        """Cut the log from `step.offset`: a divergent suffix (records from an unclean
        failover's loser, which lowers the acknowledged mark first, so a crash in between
        cannot look like a loss), or a damaged one (the mark stays, and the pchannel stays
        damaged until its records are copied back up to it)."""
        offset = step.offset
        if step.divergent:
            self.ledger.lower(ch.ledger_slot, offset)
            if offset < ch.known_commit:
                log.error(
                    "cutting below the commit offset (unclean failover)",
                    extra={"pchannel": ch.name, "from": offset},
                )
        dropped = await self.writer.call(
            lambda: self.store.truncate_from(ch.name, offset, lambda w: window_below(w, offset))
        )
        log.warning(
            "truncated divergent suffix" if step.divergent else "dropped damaged suffix",
            extra={"pchannel": ch.name, "from": offset, "to": ch.next_offset, "bytes": dropped},
        )
        ch.drop_cache_after(offset)
        return dropped, self.store.tail(ch.name).last_term

    def _store(self, ch: Channel, step: Store) -> asyncio.Future[None]:
        """Write copied records with their meta, windows, size and commit, synced: the
        synced writer's future resolves once they are durable. If the write fails the
        core goes back to what the store holds (core.unstore) -- also when nobody waits
        for the write any more (a fenced follower's stream): otherwise its log end would
        claim records the disk lacks and the next copy would leave a hole there (found
        by the simulator)."""
        store, name = self.store, ch.name
        wb = store.new_batch()
        for base, value in step.records:
            store.put_record(wb, name, base, value)
        store.put_meta(wb, name, step.meta)
        for pid, window in step.windows:
            store.put_producer(wb, name, pid, window)
        store.put_size(wb, name, ch.size_bytes)
        if step.commit is not None:
            store.put_commit(wb, name, step.commit)
        write = self.synced.write(wb)
        staged = step.staged

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is None or staged is None:
                return
            log.error(
                "write of copied records failed: the log goes back to what is durable",
                extra={"pchannel": name, "error": repr(f.exception())},
            )
            ch.core.unstore(staged)
            ch.drop_cache_after(ch.committed_next)
            ch.notify()

        write.add_done_callback(done)
        self.replication.wrote(ch, write)
        # Cached now, not after the write: the core already shows these offsets, and a
        # follower cancelled while the write is on the disk (its leader gone) must not
        # leave a hole in the tail cache that later records would be read across.
        for base, value in step.records:
            ch.cache(base, records.peek(value)[2], value)
        return write

    async def _catch_up(self, ch: Channel, source: str) -> StreamingError | None:
        """Copy the records this node lacks from `source`, cutting a divergent suffix
        first; returns the error that stopped it, if any."""
        started = time.perf_counter()
        try:
            stream = peer.fetch(source, ch.name, ch.next_offset)
            first = await anext(stream)  # the source's term history, no record
            history = [(t.term, t.first_offset) for t in first.term_history]
            cut = log_divergence(ch.meta.history, ch.next_offset, history, first.log_end)
            if cut is not None:
                await stream.aclose()
                await self.steps(ch, ch.core.truncate(cut))
                stream = peer.fetch(source, ch.name, ch.next_offset)
                await anext(stream)
            copied = await self._copy(ch, stream)
        except (StreamingError, StopAsyncIteration) as err:
            # A source that lost acknowledged records is a loss here too, not a failure.
            cls = DataLoss if isinstance(err, DataLoss) else Inner
            return cls(f"cannot catch up {ch.name!r} from {source}: {err}")
        log.info(
            "caught up",
            extra={
                "pchannel": ch.name,
                "source": source,
                "messages": copied,
                "next_offset": ch.next_offset,
                "seconds": round(time.perf_counter() - started, 3),
            },
        )
        return None

    async def _copy(self, ch: Channel, stream) -> int:
        """Store every fetched record verbatim (checksum verified), in synced chunks."""
        copied, got, pending = 0, [], 0
        async for resp in stream:
            got.append((resp.base_offset, resp.record))
            copied += records.peek(resp.record)[2]
            pending += len(resp.record)
            if pending >= COPY_BYTES:
                await self.steps(ch, ch.core.store(got))
                got, pending = [], 0
        if got:
            await self.steps(ch, ch.core.store(got))
        return copied

    # -- corruption ----------------------------------------------------------------------

    async def ensure_verified(self, ch: Channel, urgent: bool = True) -> None:
        """Verify what earlier processes wrote of `ch`'s log before this node leads it or
        reports it fit to lead: once per process, shared with the background pass that
        `start` begins, at full speed once someone is waiting (`urgent`)."""
        if not ch.unverified_end:
            return
        ch.verify_urgent = ch.verify_urgent or urgent
        await asyncio.shield(self._verification(ch))

    async def _verify(self, ch: Channel) -> None:
        loop = asyncio.get_running_loop()
        starts = frozenset(first for _, first in ch.meta.history)
        position = ch.first_offset
        try:
            while True:
                # Retention may cut the front and a divergence cut the end meanwhile.
                position = max(position, ch.first_offset)
                end = min(ch.unverified_end, ch.committed_next)
                if position >= end:
                    break
                step = await loop.run_in_executor(
                    None, self.store.verify, ch.name, position, end, starts, VERIFY_STEP_BYTES
                )
                if step.problem:
                    self.report_bad_record(
                        ch, step.position, step.problem, "verify", step.store_corrupt
                    )
                    break
                position = step.position
                if not ch.verify_urgent:
                    await asyncio.sleep(0.05)  # in the background: about 80 MB/s at most
            ch.unverified_end = 0
        finally:
            self._verifying.pop(ch.name, None)

    async def verify_before_serving(self, budget_s: float) -> None:
        """Verify, before the node serves, what earlier processes wrote, for at most
        `budget_s` (at full speed); the rest is verified in the background after `start`.
        A damaged table block found now is salvaged at once, not at the next start."""
        deadline = time.monotonic() + budget_s
        for ch in list(self.channels.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ch.verify_urgent = True
            try:
                await asyncio.wait_for(asyncio.shield(self._verification(ch)), left)
            except TimeoutError:
                ch.verify_urgent = False  # goes on in the background, paced

    def _verification(self, ch: Channel) -> asyncio.Future:
        pending = self._verifying.get(ch.name)
        if pending is None:
            pending = self._verifying[ch.name] = asyncio.ensure_future(self._verify(ch))
        return pending

    async def _verify_all(self) -> None:
        """Verify every pchannel an earlier process wrote, one after another, in the
        background: corruption is found before anyone asks for the damaged records."""
        for ch in list(self.channels.values()):
            await self.ensure_verified(ch, urgent=False)

    def report_bad_record(
        self, ch: Channel, offset: int, reason: str, found_by: str, store_corrupt: bool = False
    ) -> None:
        """A record of `ch`'s log at `offset` cannot be read back as written. The pchannel
        is served by nobody here from now on. A leader's role ends (the coord sees the
        damage in CollectStatus and moves it); a follower copies the suffix again from
        its leader (core.rebuild), unless RocksDB itself found the damage
        (`store_corrupt`): that block cannot be dropped in place, so the store is marked
        for salvage at the next start-up (salvage.py) and the follower keeps storing new
        records meanwhile."""
        effects = ch.core.found_damage(offset, reason, store_corrupt)
        if not effects:
            return  # known already
        if store_corrupt:
            salvage.mark_needed(self.store.path, f"{ch.name}@{offset}: {reason}")
        self._found_damage(ch, found_by)
        self.effects(ch, effects)
        if isinstance(ch.core.role, Following) and not ch.core.needs_salvage and not self._closing:
            rebuild = self.steps(ch, ch.core.rebuild())
            task = asyncio.get_running_loop().create_task(rebuild, name="rebuild")
            self._tasks.append(task)

    def _found_damage(self, ch: Channel, found_by: str) -> None:
        self.metrics.corruptions.labels(found_by).inc()
        log.error(
            "pchannel log lacks acknowledged records",
            extra={"pchannel": ch.name, "damage": ch.damage, "found_by": found_by},
        )
        ch.notify()

    async def _ledger_loop(self) -> None:
        """The ledger's marks reach the disk every LEDGER_SYNC_S. Under async durability
        the WAL is synced first and the marks then cover only what that sync made
        durable: a power loss takes at most that interval of acknowledged writes, and a
        lost interval is not mistaken for corruption."""
        while True:
            await asyncio.sleep(LEDGER_SYNC_S)
            channels = [] if self.store.sync else list(self.channels.values())
            ends = [(ch, ch.committed_next) for ch in channels]
            self._syncing = asyncio.ensure_future(self._sync_durable())
            try:
                await asyncio.shield(self._syncing)
            except StreamingError:  # the disk fails: the appends say so (write_health)
                continue
            for ch, end in ends:
                self.ledger.advance(ch.ledger_slot, end)
                ch.core.durable(end)

    async def _sync_durable(self) -> None:
        if not self.store.sync:
            await self.writer.call(self.store.sync_wal)
        await asyncio.get_running_loop().run_in_executor(None, self.ledger.sync)

    # -- append ------------------------------------------------------------------------

    def append(
        self,
        ch: Channel,
        term: int,
        body: bytes,
        count: int,
        flags: int = 0,
        producer: tuple[str, int] | None = None,
        barrier_time_tick: int = 0,
        on_done: Callable[[asyncio.Future], None] | None = None,
    ) -> asyncio.Future:
        """Accept `count` messages (a serialized MessageBatch); the future resolves to
        (base offset, first tick) once they are durable. Raises if fenced, and raises
        `Resent` for a batch an idempotent `producer` (id, sequence) sent before. Every
        tick of the batch is above `barrier_time_tick`.

        `on_done(future)` runs as soon as the future is done, inside the commit's own
        callback: a done-callback would run one event-loop turn later, which costs a
        one-at-a-time producer a turn's worth of latency and CPU on every message.
        """
        if self._closing:
            raise Inner("node is shutting down")
        got = ch.core.append(term, count, _now_ms(), flags, producer, barrier_time_tick)
        if isinstance(got, Resend):
            raise Resent(got.result, ch.inflight.get(producer) if got.in_flight else None)
        value = records.encode(term, got.first_tick, count, body, flags, producer)
        future = asyncio.get_running_loop().create_future()
        if producer is not None:
            ch.inflight[producer] = future
        self._committer.submit(
            _Append(
                ch,
                got.base,
                got.first_tick,
                count,
                value,
                time.perf_counter(),
                future,
                producer,
                on_done,
                term,
                flags,
            )
        )
        return future

    def evict_idle_producers(self, ch: Channel) -> None:
        """Drop idle producers' state from memory; a producer per Spark task or batch
        would otherwise grow a long-lived node without bound."""
        ch.core.evict_idle(_now_ms(), int(self.config.producer_idle_s * 1000))

    def last_sequence(self, ch: Channel, producer_id: str) -> int:
        return ch.core.window(producer_id, _now_ms()).accepted

    def _prepare(self, group: list, wb) -> bool:
        """The group's records, producer windows, retention cuts and each pchannel's size
        once the group is durable (the core counts the same when told `written`).

        The records are cached now, as they go to the disk, and a leader's replication
        streams are woken: its followers get them while its own fsync runs. A stream
        that wrote them to its idle follower's socket from the waker itself needs
        nothing more of the loop; if any stream's task was woken instead, the write
        stays off the event loop so it can send meanwhile (True). So does every write
        of a node that follows some pchannel: its loop sends those leaders heartbeats,
        and an fsync on the loop that meets a disk stall would silence them for the
        whole stall (decisions-replicated-path.md, "A follower's synced writes never run
        on its loop"). Readers stop at the durable end; a failed write drops them again
        (`_failed`)."""
        sizes: dict[str, tuple[Channel, int]] = {}
        for item in group:
            ch = item.channel
            size = sizes[ch.name][1] if ch.name in sizes else ch.size_bytes
            if isinstance(item, _Append):
                self.store.put_record(wb, ch.name, item.base, item.value)
                ch.cache(item.base, item.count, item.value)
                size += len(item.value)
                if item.producer is not None:
                    pid, seq = item.producer
                    window = ch.core.producers[pid].encode_upto(seq)
                    self.store.put_producer(wb, ch.name, pid, window)
            else:
                wb.delete_range(log_key(ch.name, 0), log_key(ch.name, item.keep_from))
                for producer_id in item.producers:
                    self.store.drop_producer(wb, ch.name, producer_id)
                size -= item.freed
            sizes[ch.name] = (ch, size)
        streamed = False
        for name, (ch, size) in sizes.items():
            self.store.put_size(wb, name, size)
            self.replication.persist_commit(ch, wb)
            for wake in ch.wakers:
                streamed = not wake() or streamed
        return streamed or self.replication.following

    def _committed(self, group: list) -> None:
        now = time.perf_counter()
        durable = self.store.sync  # async: the ledger follows the periodic WAL sync
        recovered = self.write_health.succeeded()
        if recovered is not None:
            since, failures = recovered
            log.warning(
                "WAL writes succeed again",
                extra={"failed_writes": failures, "seconds": round(time.monotonic() - since, 1)},
            )
        touched: dict[str, Channel] = {}
        m = self.metrics
        for item in group:
            ch = item.channel
            touched[ch.name] = ch
            if isinstance(item, _Append):
                end = item.base + item.count
                # Before the answer: the mark covers every acknowledged offset (sync: the
                # core's MarkDurable), the ceiling every one a power loss may take (async).
                self.effects(
                    ch,
                    ch.core.written(
                        item.base, item.count, len(item.value), item.term, item.producer, durable
                    ),
                    notify=False,
                )
                if not durable:
                    self._reserve(ch, end)
                m.count_append(ch.name, item.count, len(item.value), item.flags)
                m.append_latency.observe(now - item.accepted_at)
                if item.producer is not None:
                    ch.inflight.pop(item.producer, None)
                if not item.future.done():
                    item.future.set_result((item.base, item.first_tick))
                    _run_on_done(item)
            else:
                ch.core.retained(item.keep_from, item.freed)
                ch.drop_cache_before(item.keep_from)
                if not item.future.done():
                    item.future.set_result(None)
        for ch in touched.values():
            ch.notify()

    def unhealthy(self, ch: Channel) -> str:
        """Why this node cannot serve `ch` well now ("": it can): CollectStatus says so,
        and the coord moves leadership away (health.py)."""
        return self.write_health.reason(time.monotonic()) or self.replication.quorum_lost(ch)

    def _failed(self, group: list, exc: BaseException) -> None:
        if isinstance(exc, StoreUnwritable):  # the disk: the node is unhealthy while it lasts
            health = self.write_health
            report = health.failed(time.monotonic(), exc.cause)
            if report is not None:
                log.error(
                    "WAL writes failing" if report == "first" else "WAL writes still failing",
                    extra={
                        "error": exc.cause,
                        "failed_writes": health.failures,
                        "items": len(group),
                    },
                )
            err: StreamingError = exc
        else:  # an item that could not be prepared (group_commit._write_apart): a bug
            log.error(
                "appends could not be written", extra={"error": repr(exc), "items": len(group)}
            )
            err = Inner(f"append failed: {exc}")
        touched: dict[str, tuple[Channel, list[tuple[str, int]]]] = {}
        for item in group:
            ch = item.channel
            lost = touched.setdefault(ch.name, (ch, []))[1]
            if isinstance(item, _Append) and item.producer is not None:
                ch.inflight.pop(item.producer, None)
                lost.append(item.producer)
            if not item.future.done():
                item.future.set_exception(err)
                if isinstance(item, _Append):
                    _run_on_done(item)
        for ch, lost in touched.values():
            # Forget what never became durable (the resend is appended for real) and hand
            # the lost offsets out again -- or, on a leader whose followers may hold them
            # already, end the role (core.write_failed).
            ch.drop_cache_after(ch.committed_next)
            self.effects(ch, ch.core.write_failed(lost))

    def _channel_states(self) -> list[ChannelState]:
        return [
            ChannelState(
                ch.name,
                ch.term,
                ch.size_bytes,
                ch.committed_next,
                ch.known_commit,
                len(ch.producer_states),
                int(bool(ch.damage)),
                ch.meta.retention_age_ms / 1000,
                ch.meta.retention_bytes,
            )
            for ch in list(self.channels.values())
        ]

    # -- reads -------------------------------------------------------------------------

    def read(
        self, ch: Channel, offset: int, limit: int, max_bytes: int = READ_BYTES, raw: bool = False
    ) -> list[tuple[int, bytes]]:
        """Visible records (`raw`: every durable one) from the one holding `offset` (up to
        `limit` records or about `max_bytes`); empty when caught up."""
        end = ch.committed_next if raw else ch.visible_next
        if offset >= end:
            return []
        out = ch.cached_from(offset, limit, max_bytes)
        if out is None:
            try:
                out = self.store.records_from(ch.name, offset, limit, max_bytes)
            except StoreCorruption as err:
                self.report_bad_record(ch, offset, err.cause, "read", store_corrupt=True)
                raise
        return _below(out, end)

    async def read_raw(
        self, ch: Channel, offset: int, limit: int, max_bytes: int, end: int = 0
    ) -> list[tuple[int, bytes]]:
        """Records below `end` (default: the durable end) as `read(raw=True)`, reading
        RocksDB in a worker thread: a far behind follower's catch-up must not stall the
        event loop. A leader streams up to `sendable_end`."""
        end = end or ch.committed_next
        out = self.cached_raw(ch, offset, limit, max_bytes, end)
        if out is not None:
            return out
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                None, self.store.records_from, ch.name, offset, limit, max_bytes
            )
        except StoreCorruption as err:
            self.report_bad_record(ch, offset, err.cause, "read", store_corrupt=True)
            raise
        return _below(out, end)

    @staticmethod
    def cached_raw(
        ch: Channel, offset: int, limit: int, max_bytes: int, end: int
    ) -> list[tuple[int, bytes]] | None:
        """`read_raw` from the tail cache alone, with no await: None when the records
        must come from RocksDB (a leader's stream writing from its waker, replication.py)."""
        if offset >= end:
            return []
        out = ch.cached_from(offset, limit, max_bytes)
        return None if out is None else _below(out, end)

    @staticmethod
    def sendable_end(ch: Channel) -> int:
        """Where a leader's records end that its followers may have: durable, or cached
        on their way to the disk (`_prepare`), never past the offsets handed out."""
        return min(ch.next_offset, max(ch.committed_next, ch.cached_end))

    # -- housekeeping ------------------------------------------------------------------

    def want_ticks(self, ch: Channel, readers: int) -> None:
        """`readers` consumers of `ch` that take time ticks came (+1) or went (-1); 0 for
        one that skips them."""
        ch.tick_readers += readers
        if ch.tick_readers > 0:
            self._tick_wanted[ch.name] = ch
        elif self._tick_wanted.get(ch.name) is ch:
            del self._tick_wanted[ch.name]

    async def _tick_idle_channels(self) -> None:
        """Idle time ticks, for the readers that take them: a pchannel led here with a
        consumer that did not ask to skip ticks gets one per --time-tick-interval while
        nothing else is appended; one without such a reader gets none, so ticks cost per
        reader, not per pchannel (issue 24: at 200 ms, 1,024 idle RF=3 pchannels were
        ~5,000 appends and ~10,000 copies a second, which saturated 4 nodes on 2 cores).
        The quorum lease no longer needs them (replication.py: heartbeats) and age
        retention writes its own (`apply_retention`). Decisions: docs/decisions-scale.md."""
        interval = self.config.time_tick_interval_s
        while True:
            await asyncio.sleep(interval / 2)
            now = _now_ms()
            for ch in list(self._tick_wanted.values()):
                if ch.core.idle(now, int(interval * 1000)):
                    self._idle_tick(ch)

    def _idle_tick(self, ch: Channel) -> None:
        """A time tick on an idle pchannel this node leads (none if it does not)."""
        with contextlib.suppress(StreamingError):
            self.append(ch, ch.term, _TIME_TICK_BODY, 1, records.FLAG_TIME_TICK)

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_interval_s)
            for ch in list(self.channels.values()):
                self.evict_idle_producers(ch)
                await self.apply_retention(ch)

    async def apply_retention(self, ch: Channel) -> None:
        meta = ch.meta
        if not (meta.retention_age_ms or meta.retention_bytes):
            return
        if meta.retention_age_ms and ch.core.idle(_now_ms(), meta.retention_age_ms):
            # The newest record is always kept (retention.plan_cut); on a pchannel idle
            # past the age bound one tick makes the expired data before it cuttable.
            self._idle_tick(ch)
        loop = asyncio.get_running_loop()
        size = ch.size_bytes
        plan = await loop.run_in_executor(
            None,
            lambda: plan_cut(
                self.store.iter_headers(ch.name),
                now_ms=time.time_ns() // 1_000_000,
                total_bytes=size,
                max_age_ms=meta.retention_age_ms,
                max_bytes=meta.retention_bytes,
            ),
        )
        if plan is None:
            return
        keep_from, freed = plan
        if self.before_cut is not None:
            await self.before_cut(ch, keep_from)
        window_ends = await loop.run_in_executor(
            None,
            lambda: [(pid, window_end(raw)) for pid, raw in self.store.producer_windows(ch.name)],
        )
        # Chosen and submitted in one step: an append from a chosen producer can only
        # come later, and its window is then written after the cut's delete.
        forget = ch.core.forget_cut(window_ends, keep_from)
        future = loop.create_future()
        self._committer.submit(_Truncate(ch, keep_from, freed, future, forget))
        await future
        log.info(
            "retention",
            extra={
                "pchannel": ch.name,
                "first_offset": keep_from,
                "freed": freed,
                "producers_forgotten": len(forget),
            },
        )
