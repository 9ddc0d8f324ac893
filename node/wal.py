"""The node's write-ahead log: pchannels over one LogStore, fenced by terms.

Owns the per-pchannel state (channel.py), the group committer and two housekeeping
tasks: idle time ticks (so time-tick consumers progress on quiet pchannels) and
retention. All methods run on the event loop; RocksDB writes happen in a worker thread
inside the group committer; reads are short and bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from streamwal.errors import (
    ChannelFenced,
    DataLoss,
    IgnoredOperation,
    Inner,
    InvalidArgument,
    StreamingError,
)
from streamwal.message import PROP_TYPE, MsgType
from streamwal.node import peer, records, salvage
from streamwal.node.ack_ledger import AckLedger
from streamwal.node.channel import Channel
from streamwal.node.channel_meta import ChannelMeta
from streamwal.node.clock import BarrierTooFar
from streamwal.node.config import NodeConfig
from streamwal.node.divergence import cut_history, extend_history, log_divergence
from streamwal.node.fencing import (
    AssignOutcome,
    check_access,
    decide_assign,
    decide_damaged_assign,
    decide_remove,
)
from streamwal.node.group_commit import GroupCommitter
from streamwal.node.health import WriteHealth
from streamwal.node.log_store import LogStore, StoreCorruption, StoreUnwritable, log_key
from streamwal.node.metrics import ChannelState, NodeMetrics
from streamwal.node.producers import (
    BatchResult,
    Duplicate,
    ProducerState,
    check_sequence,
    cut_producers,
    idle_producers,
    window_below,
    window_end,
)
from streamwal.node.replica import LeaderRole
from streamwal.node.replication import Replication, parse_replica_set
from streamwal.node.retention import plan_cut
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.wal")

MAX_NAME_BYTES = 200
READ_BYTES = 4 * 1024 * 1024  # one read step of a consumer or a fetch
VERIFY_STEP_BYTES = 4 * 1024 * 1024  # records checked per step of a verification
LEDGER_SYNC_S = 1.0  # the ledger's marks reach the disk (and, async, the WAL) this often
CEILING_RESERVE = 1 << 16  # async: offsets reserved per durable raise of a ceiling
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


def validate_name(name: str) -> None:
    raw = name.encode()
    if not raw or len(raw) > MAX_NAME_BYTES or "\0" in name or not name.isprintable():
        raise InvalidArgument(
            f"invalid pchannel name {name!r}: 1..{MAX_NAME_BYTES} printable bytes, no NUL"
        )


class Wal:
    def __init__(self, store: LogStore, config: NodeConfig, metrics: NodeMetrics) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.channels: dict[str, Channel] = {}
        self.ledger = AckLedger(store.path)
        self._verifying: dict[str, asyncio.Future] = {}
        self._syncing: asyncio.Future | None = None
        self.write_health = WriteHealth()
        self._committer = GroupCommitter(
            store,
            self._prepare,
            self._committed,
            self._failed,
            metrics.fsync_latency.observe,
        )
        self._group_sizes: dict[str, tuple[Channel, int]] = {}
        self._tasks: list[asyncio.Task] = []
        self._closing = False
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
            if name not in self.channels:
                ch = self._load_channel(name, ChannelMeta())
                ch.bad_reason = "the store has no record of this pchannel (its meta is lost)"
                ch.bad_from = ch.first_offset

    def _load_channel(self, name: str, meta: ChannelMeta) -> Channel:
        ch = Channel(name, meta, self.store.tail(name), self.store.load_commit(name))
        ch.unverified_end = ch.committed_next
        mark = self.ledger.mark(name)
        ch.ledger_slot = self.ledger.slot(name, ch.committed_next)
        if mark is not None and ch.committed_next < mark:
            ch.lost_until = mark
            self._found_damage(ch, "ledger")
        ch.ceiling = self.ledger.ceiling(name)
        if ch.ceiling > ch.committed_next and ch.commit is None and not ch.damage:
            self._skip_to_ceiling(ch)
        self.channels[name] = ch
        return ch

    def _skip_to_ceiling(self, ch: Channel) -> None:
        """After an unclean stop under async durability the log may end below offsets it
        acknowledged (a power loss takes the last second by design): one internal record
        covers everything up to the ceiling, so those offsets are never handed out again,
        and the log stays dense. Written before the node serves."""
        end = ch.committed_next
        term = ch.last_term or (ch.meta.history[-1][0] if ch.meta.history else 0)
        flags = records.FLAG_SKIP | records.FLAG_SHARED_TICK
        value = records.encode(term, ch.clock.allocate(1), ch.ceiling - end, b"", flags)
        wb = self.store.new_batch()
        self.store.put_record(wb, ch.name, end, value)
        self.store.put_size(wb, ch.name, ch.size_bytes + len(value))
        self.store.write_synced(wb)
        ch.committed(end, ch.ceiling - end, value)
        ch.next_offset = ch.ceiling
        ch.size_bytes += len(value)
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
        ]

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._committer.close()
        for ch in self.channels.values():
            self.replication.stop_role(ch, None)
            ch.notify()
        if self._syncing is not None:
            await asyncio.gather(self._syncing, return_exceptions=True)
        for pending in list(self._verifying.values()):
            pending.cancel()
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
        parsed = parse_replica_set(replica_set, self.config.node_id)
        following = parsed is not None and parsed[0] == pb.REPLICA_ROLE_FOLLOWER
        ch = self.channels.get(name)
        outcome = decide_assign(ch.fence if ch else None, term)
        if ch is not None:
            if not following:
                await self.ensure_verified(ch)
            cut = decide_damaged_assign(
                name, ch.damage, ch.bad_needs_salvage, following, accept_data_loss, outcome
            )
            ch.recovering = False
            if cut:
                await self._cut_damage(ch, accept=not following)
        if outcome is not AssignOutcome.TAKE:
            assert ch is not None
            if self.replication.configure(ch, replica_set):
                self._tick(ch)
            if retention is not None and ch is not None:
                ch.meta = replace(
                    ch.meta,
                    retention_age_ms=retention.max_age_ms,
                    retention_bytes=retention.max_bytes,
                )
                await asyncio.get_running_loop().run_in_executor(
                    None, self.store.save_meta, name, ch.meta
                )
            return outcome
        if ch is None:
            ch = self._new_channel(name)
        else:
            # Until the new term is in place (awaits below), the old one is served by
            # nobody here: not by a stale producer, and not by the idle TimeTick, which
            # a follower-to-be would keep as a record its new leader cannot tell from
            # its own (same term, same offset): a silently divergent replica. A failed
            # take leaves it so: the coord has moved on from the old term.
            ch.taking = term
            role = ch.replica
            self.replication.stop_role(ch, None)
            await self.replication.settle(role)
            await self._drain(ch)
        if catch_up_from:
            try:
                await self._catch_up(ch, catch_up_from)
            except StreamingError:
                if not ch.meta.term:  # never assigned here: leave no trace of the attempt
                    self.channels.pop(name, None)
                raise
        if ch.next_offset < min_next_offset and not following:  # never reuse offsets
            log.warning(
                "offset gap",
                extra={"pchannel": name, "from": ch.next_offset, "to": min_next_offset},
            )
            ch.next_offset = ch.committed_next = min_next_offset
        # A follower's history follows the records it copies; a leader's term starts here.
        history = ch.meta.history if following else [*ch.meta.history, (term, ch.next_offset)]
        meta = replace(ch.meta, term=term, assigned_term=term, serving=True, history=history)
        if retention is not None:
            meta = replace(
                meta, retention_age_ms=retention.max_age_ms, retention_bytes=retention.max_bytes
            )
        await asyncio.get_running_loop().run_in_executor(None, self.store.save_meta, name, meta)
        ch.meta = meta
        ch.taking = 0  # the role below is set in the same step: no gap to serve in
        if self.replication.configure(ch, replica_set):
            self._tick(ch)
        ch.notify()  # consumers under the old term see the fence move
        log.info(
            "assigned",
            extra={
                "pchannel": name,
                "term": term,
                "next_offset": ch.next_offset,
                "role": "follower" if following else "leader",
            },
        )
        return outcome

    def _new_channel(self, name: str, term: int = 0) -> Channel:
        """A pchannel this node has no meta for yet, with the node's default retention."""
        meta = ChannelMeta(
            term=term,
            retention_age_ms=self.config.default_retention_age_ms,
            retention_bytes=self.config.default_retention_bytes,
        )
        ch = Channel(name, meta, self.store.tail(name), self.store.load_commit(name))
        # Durable before the pchannel's meta is: a pchannel with meta always has a mark.
        ch.ledger_slot = self.ledger.slot(name, ch.committed_next)
        self.channels[name] = ch
        return ch

    def _tick(self, ch: Channel) -> None:
        """A new leader's first record: committing it commits the older terms' records
        below it (replication_rules.commit_offset), so do not wait for the idle tick."""
        self.append(ch, ch.term, _TIME_TICK_BODY, 1, records.FLAG_TIME_TICK)

    async def fence(self, name: str, term: int) -> tuple[int, int, int, str]:
        """Raise the accepted term of `name` to `term` (persisted; any lower role ends) and
        report (last record's term, log end, commit offset, damage). A lower or equal term
        only reports. Works whether or not the node serves or even holds the pchannel.

        The log is verified first (once per process): a replica whose log lacks
        acknowledged records says so (it may not lead), and its commit offset then covers
        every offset it acknowledged, so no leader is chosen that lacks them.
        """
        validate_name(name)
        if term < 1:
            raise IgnoredOperation(f"term must be >= 1, got {term}")
        ch = self.channels.get(name)
        if ch is None:
            ch = self._new_channel(name, term)
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.save_meta, name, ch.meta
            )
        elif term > ch.meta.term:
            ch.meta = replace(ch.meta, term=term)
            role = ch.replica
            self.replication.stop_role(
                ch, ChannelFenced(f"pchannel {name!r} was fenced at term {term}")
            )
            await self.replication.settle(role)
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.save_meta, name, ch.meta
            )
            await self._drain(ch)
            log.info("fenced", extra={"pchannel": name, "term": term})
        await self.ensure_verified(ch)
        damage = ch.damage
        if damage:
            acked = max(self.ledger.mark(name) or 0, ch.lost_until)
            return ch.last_term, ch.committed_next, max(ch.known_commit, acked), damage
        return ch.last_term, ch.committed_next, ch.known_commit, ""

    async def _catch_up(self, ch: Channel, source: str) -> None:
        """Copy the records this node lacks from `source`, cutting a divergent suffix first."""
        started = time.perf_counter()
        try:
            stream = peer.fetch(source, ch.name, ch.next_offset)
            first = await anext(stream)  # the source's term history, no record
            history = [(t.term, t.first_offset) for t in first.term_history]
            cut = log_divergence(ch.meta.history, ch.next_offset, history, first.log_end)
            if cut is not None:
                await stream.aclose()
                await self.truncate_suffix(ch, cut)
                stream = peer.fetch(source, ch.name, ch.next_offset)
                await anext(stream)
            copied = await self._copy(ch, stream, source)
        except (StreamingError, StopAsyncIteration) as err:
            # A source that lost acknowledged records is a loss here too, not a failure.
            cls = DataLoss if isinstance(err, DataLoss) else Inner
            raise cls(f"cannot catch up {ch.name!r} from {source}: {err}") from None
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

    async def _copy(self, ch: Channel, stream, source: str) -> int:
        """Write every fetched record verbatim (checksum verified), in synced chunks."""
        copied, wb, pending = 0, self.store.new_batch(), 0
        async for resp in stream:
            where = f"{ch.name}@{resp.base_offset} from {source}"
            rec = records.decode(resp.record, where)
            self.apply_copied(ch, wb, resp.base_offset, resp.record, rec)
            copied += rec.count
            pending += len(resp.record)
            if pending >= 8 * 1024 * 1024:
                self.store.put_size(wb, ch.name, ch.size_bytes)
                await self.write_copied(ch, wb)
                self.mark_durable(ch)
                wb, pending = self.store.new_batch(), 0
        self.store.put_size(wb, ch.name, ch.size_bytes)
        await self.write_copied(ch, wb)
        self.mark_durable(ch)
        return copied

    def write_copied(self, ch: Channel, wb) -> asyncio.Future:
        """Write copied records (applied to `ch` already), synced, in a worker thread. If
        the write fails, `ch` goes back to what the store holds -- also when nobody waits
        for the write any more (a fenced follower's stream): otherwise its log end would
        claim records the disk lacks and the next copy would leave a hole there (found by
        the simulator, streamwal.testing.sim)."""
        write = asyncio.get_running_loop().run_in_executor(None, self.store.write_synced, wb)

        def done(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is not None:
                self.rewind_to_store(ch, f.exception())

        write.add_done_callback(done)
        return write

    def rewind_to_store(self, ch: Channel, error: BaseException | None) -> None:
        """`ch`'s log end, size, last term and history as the store holds them (its term
        stays: a fence may have raised it meanwhile, and terms never go back)."""
        tail = self.store.tail(ch.name)
        stored = self.store.load_meta(ch.name)
        history = list(stored.history) if stored is not None else []
        end = max([tail.next_offset, *(first for _, first in history)])
        log.error(
            "write of copied records failed: the log goes back to what is durable",
            extra={"pchannel": ch.name, "from": ch.committed_next, "to": end, "error": repr(error)},
        )
        ch.meta = replace(ch.meta, history=history)
        ch.next_offset = ch.committed_next = end
        ch.first_offset = tail.first_offset
        ch.size_bytes = tail.size_bytes
        ch.last_term = tail.last_term
        if ch.commit is not None:
            ch.commit = min(ch.commit, end)
        ch.drop_cache_after(end)
        ch.producer_states.clear()
        ch.notify()

    def apply_copied(self, ch: Channel, wb, base: int, value: bytes, rec: records.Record) -> None:
        """Add a record copied from another node to `wb`, with the producer window and the
        term history it implies (catch-up and replication share this)."""
        self.store.put_record(wb, ch.name, base, value)
        history = extend_history(ch.meta.history, rec.term, base)
        if history is not None:
            ch.meta = replace(ch.meta, history=history)
            self.store.put_meta(wb, ch.name, ch.meta)
        if rec.producer is not None:
            pid, seq = rec.producer
            state = self._producer_state(ch, pid)
            state.add(seq, BatchResult(base, rec.first_tick, rec.count))
            self.store.put_producer(wb, ch.name, pid, state.encode_upto(seq))
        if ch.next_offset == 0 and not ch.size_bytes:
            ch.first_offset = base
        ch.committed(base, rec.count, value)
        ch.next_offset = base + rec.count
        ch.size_bytes += len(value)
        ch.last_term = rec.term
        ch.clock.observe(rec.last_tick)

    async def truncate_suffix(self, ch: Channel, offset: int, divergent: bool = True) -> None:
        """Cut this node's log from `offset`: a divergent suffix (records from an unclean
        failover's loser, which lowers the acknowledged mark first, so a crash in between
        cannot look like a loss), or a damaged one (`divergent=False`: the mark stays, and
        the pchannel stays damaged until its records are copied back up to it)."""
        loop = asyncio.get_running_loop()
        if divergent:
            self.ledger.lower(ch.ledger_slot, offset)
        dropped = await loop.run_in_executor(
            None, self.store.truncate_from, ch.name, offset, lambda w: window_below(w, offset)
        )
        ch.meta = replace(ch.meta, history=cut_history(ch.meta.history, offset))
        await loop.run_in_executor(None, self.store.save_meta, ch.name, ch.meta)
        log.warning(
            "truncated divergent suffix" if divergent else "dropped damaged suffix",
            extra={"pchannel": ch.name, "from": offset, "to": ch.next_offset, "bytes": dropped},
        )
        ch.next_offset = ch.committed_next = offset
        if ch.commit is not None:
            ch.commit = min(ch.commit, offset)
        ch.size_bytes = max(0, ch.size_bytes - dropped)
        ch.drop_cache_after(offset)
        ch.producer_states.clear()
        tail = self.store.tail(ch.name)
        ch.last_term = tail.last_term

    # -- corruption ----------------------------------------------------------------------

    def mark_durable(self, ch: Channel) -> None:
        """Record in the ledger that `ch`'s log is durable up to its end (before the end is
        acknowledged to anyone: a producer, a leader, a catching-up node)."""
        self.ledger.advance(ch.ledger_slot, ch.committed_next)

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
        its leader, unless RocksDB itself found the damage (`store_corrupt`): that block
        cannot be dropped in place, so the store is marked for salvage at the next
        start-up (salvage.py) and the follower keeps storing new records meanwhile."""
        if ch.bad_from is not None and ch.bad_from <= offset:
            return
        ch.bad_from, ch.bad_reason = offset, reason
        ch.bad_needs_salvage = ch.bad_needs_salvage or store_corrupt
        if store_corrupt:
            salvage.mark_needed(self.store.path, f"{ch.name}@{offset}: {reason}")
        self._found_damage(ch, found_by)
        role = ch.replica
        if isinstance(role, LeaderRole):
            self.replication.stop_role(
                ch, DataLoss(f"pchannel {ch.name!r} lost acknowledged records: {ch.damage}")
            )
        elif role is not None and not ch.bad_needs_salvage and not self._closing:
            task = asyncio.get_running_loop().create_task(self._rebuild(ch), name="rebuild")
            self._tasks.append(task)

    def _found_damage(self, ch: Channel, found_by: str) -> None:
        self.metrics.corruptions.labels(found_by).inc()
        log.error(
            "pchannel log lacks acknowledged records",
            extra={"pchannel": ch.name, "damage": ch.damage, "found_by": found_by},
        )
        ch.notify()

    async def _rebuild(self, ch: Channel) -> None:
        """A follower found its log damaged: drop the damaged suffix and follow again."""
        role = ch.replica
        if role is None or isinstance(role, LeaderRole):
            return
        self.replication.stop_role(ch, None)
        await self.replication.settle(role)
        await self._drain(ch)
        await self._cut_damage(ch, accept=False)
        if ch.replica is None and ch.meta.term == role.term:
            self.replication.follow_again(ch, role)

    async def _cut_damage(self, ch: Channel, accept: bool) -> None:
        """Drop the unreadable suffix of `ch`'s log, keeping its acknowledged mark: the
        pchannel stays damaged until its records are copied back up to the mark (a
        follower), unless the loss is accepted: then the log continues above every offset
        this node ever acknowledged (the new term's start, persisted by the caller)."""
        if ch.bad_from is not None:
            cut = max(ch.bad_from, ch.first_offset)
            ch.lost_until = max(ch.lost_until, self.ledger.mark(ch.name) or 0)
            await self.truncate_suffix(ch, cut, divergent=False)
            ch.bad_from, ch.bad_reason = None, ""
        if accept and ch.committed_next < ch.lost_until:
            log.warning(
                "data loss accepted",
                extra={"pchannel": ch.name, "lost": [ch.committed_next, ch.lost_until - 1]},
            )
            ch.next_offset = ch.committed_next = ch.lost_until

    async def _ledger_loop(self) -> None:
        """The ledger's marks reach the disk every LEDGER_SYNC_S. Under async durability
        the WAL is synced first and the marks then cover only what that sync made
        durable: a power loss takes at most that interval of acknowledged writes, and a
        lost interval is not mistaken for corruption."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LEDGER_SYNC_S)
            channels = [] if self.store.sync else list(self.channels.values())
            ends = [(ch, ch.committed_next) for ch in channels]
            self._syncing = loop.run_in_executor(None, self._sync_durable)
            try:
                await asyncio.shield(self._syncing)
            except StreamingError:  # the disk fails: the appends say so (write_health)
                continue
            for ch, end in ends:
                self.ledger.advance(ch.ledger_slot, end)

    def _sync_durable(self) -> None:
        if not self.store.sync:
            self.store.sync_wal()
        self.ledger.sync()

    async def remove(self, name: str, term: int) -> None:
        ch = self.channels.get(name)
        decide_remove(ch.fence if ch else None, name, term)
        assert ch is not None
        ch.meta = replace(ch.meta, serving=False)
        self.replication.stop_role(ch, None)
        ch.notify()
        await self._drain(ch)
        await asyncio.get_running_loop().run_in_executor(None, self.store.save_meta, name, ch.meta)
        log.info("removed", extra={"pchannel": name, "term": ch.meta.term})

    def access(self, name: str, term: int) -> Channel:
        """The pchannel if a Produce/Consume under `term` may use it; raises otherwise."""
        ch = self.channels.get(name)
        check_access(ch.fence if ch else None, name, term)
        assert ch is not None
        return ch

    async def _drain(self, ch: Channel) -> None:
        """Wait until everything accepted for `ch` is durable (or failed)."""
        while ch.committed_next < ch.next_offset and not self._closing:
            await ch.wait_changed(0.05)

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
        check_access(ch.fence, ch.name, term)
        state = None
        if producer is not None:
            state = self._producer_state(ch, producer[0])
            try:
                check_sequence(state, producer[1], producer[0])
            except Duplicate as dup:
                raise Resent(dup.result, ch.inflight.get(producer)) from None
        if barrier_time_tick:
            try:
                ch.clock.push_past(barrier_time_tick)
            except BarrierTooFar as exc:
                raise InvalidArgument(str(exc)) from None
        base = ch.next_offset
        ch.next_offset = base + count
        first_tick = ch.clock.allocate(records.ticks_used(flags, count))
        value = records.encode(term, first_tick, count, body, flags, producer)
        future = asyncio.get_running_loop().create_future()
        if not flags & records.INTERNAL_FLAGS:  # cursor records must not hold back ticks
            ch.last_append_ms = time.monotonic() * 1000
        if producer is not None and state is not None:
            state.add(producer[1], BatchResult(base, first_tick, count))
            ch.inflight[producer] = future
        self._committer.submit(
            _Append(
                ch,
                base,
                first_tick,
                count,
                value,
                time.perf_counter(),
                future,
                producer,
                on_done,
                term,
            )
        )
        return future

    def _producer_state(self, ch: Channel, producer_id: str) -> ProducerState:
        state = ch.producer_states.get(producer_id)
        if state is None:
            raw = self.store.load_producer(ch.name, producer_id)
            state = ProducerState.decode(raw) if raw else ProducerState()
            ch.producer_states[producer_id] = state
        else:
            ch.producer_states.move_to_end(producer_id)
        state.last_used = time.monotonic()
        return state

    def evict_idle_producers(self, ch: Channel) -> None:
        """Drop idle producers' state from memory; a producer per Spark task or batch
        would otherwise grow a long-lived node without bound."""
        for producer_id in idle_producers(
            ch.producer_states,
            time.monotonic(),
            self.config.producer_idle_s,
            ch.producers_in_flight(),
        ):
            del ch.producer_states[producer_id]

    def last_sequence(self, ch: Channel, producer_id: str) -> int:
        return self._producer_state(ch, producer_id).accepted

    def _prepare(self, group: list, wb) -> None:
        sizes: dict[str, tuple[Channel, int]] = {}
        for item in group:
            ch = item.channel
            size = sizes[ch.name][1] if ch.name in sizes else ch.size_bytes
            if isinstance(item, _Append):
                self.store.put_record(wb, ch.name, item.base, item.value)
                size += len(item.value)
                if item.producer is not None:
                    pid, seq = item.producer
                    window = ch.producer_states[pid].encode_upto(seq)
                    self.store.put_producer(wb, ch.name, pid, window)
            else:
                wb.delete_range(log_key(ch.name, 0), log_key(ch.name, item.keep_from))
                for producer_id in item.producers:
                    self.store.drop_producer(wb, ch.name, producer_id)
                size -= item.freed
            sizes[ch.name] = (ch, size)
        for name, (ch, size) in sizes.items():
            self.store.put_size(wb, name, size)
            self.replication.persist_commit(ch, wb)
        self._group_sizes = sizes

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
                ch.committed(item.base, item.count, item.value)
                # Before the answer: the mark covers every acknowledged offset (sync), the
                # ceiling every one a power loss may take (async).
                if durable:
                    self.ledger.advance(ch.ledger_slot, item.base + item.count)
                else:
                    self._reserve(ch, item.base + item.count)
                # The record's term, not the channel's: a Fence raises that before the
                # writes in flight drain, and its report must name the last record's term
                # (found by the simulator: the raised term made a stale log look newest).
                ch.last_term = item.term
                m.count_append(ch.name, item.count, item.value)
                m.append_latency.observe(now - item.accepted_at)
                if item.producer is not None:
                    ch.inflight.pop(item.producer, None)
                if not item.future.done():
                    item.future.set_result((item.base, item.first_tick))
                    _run_on_done(item)
            else:
                ch.first_offset = max(ch.first_offset, item.keep_from)
                ch.drop_cache_before(item.keep_from)
                if not item.future.done():
                    item.future.set_result(None)
        for ch, size in self._group_sizes.values():
            ch.size_bytes = size
        for ch in touched.values():
            if isinstance(ch.replica, LeaderRole):
                self.replication.advance(ch)
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
        touched: dict[str, Channel] = {}
        for item in group:
            ch = item.channel
            touched[ch.name] = ch
            if isinstance(item, _Append) and item.producer is not None:
                # Forget what never became durable, so the resend is appended for real.
                pid, seq = item.producer
                ch.inflight.pop(item.producer, None)
                state = ch.producer_states.get(pid)
                if state is not None:
                    state.forget(seq)
            if not item.future.done():
                item.future.set_exception(err)
                if isinstance(item, _Append):
                    _run_on_done(item)
        for ch in touched.values():
            ch.rewind_uncommitted()
            ch.notify()

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
        self, ch: Channel, offset: int, limit: int, max_bytes: int
    ) -> list[tuple[int, bytes]]:
        """Durable records as `read(raw=True)`, reading RocksDB in a worker thread: a far
        behind follower's catch-up must not stall the event loop."""
        end = ch.committed_next
        if offset >= end:
            return []
        out = ch.cached_from(offset, limit, max_bytes)
        if out is None:
            try:
                out = await asyncio.get_running_loop().run_in_executor(
                    None, self.store.records_from, ch.name, offset, limit, max_bytes
                )
            except StoreCorruption as err:
                self.report_bad_record(ch, offset, err.cause, "read", store_corrupt=True)
                raise
        return _below(out, end)

    # -- housekeeping ------------------------------------------------------------------

    async def _tick_idle_channels(self) -> None:
        interval = self.config.time_tick_interval_s
        while True:
            await asyncio.sleep(interval / 2)
            now = time.monotonic() * 1000
            for ch in list(self.channels.values()):
                if ch.meta.serving and now - ch.last_append_ms >= interval * 1000:
                    try:
                        self.append(ch, ch.term, _TIME_TICK_BODY, 1, records.FLAG_TIME_TICK)
                    except StreamingError:
                        continue

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
        forget = cut_producers(window_ends, keep_from, ch.producer_states, ch.producers_in_flight())
        for producer_id in forget:
            ch.producer_states.pop(producer_id, None)
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
