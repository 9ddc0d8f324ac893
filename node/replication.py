"""Leader -> follower replication of a pchannel: the streams' I/O around the cores.

A follower opens `Replicate` to its leader and sends ReplicaAcks (its log end; the first
one with its term history). The leader answers with LogEntries: its stored records
verbatim from where the two logs agree (`truncate_from` on the first entry when the
follower holds a suffix the leader does not), read from the tail cache or from RocksDB
in a worker thread, never more than WINDOW_BYTES ahead of the follower's acks, then the
new records as they go to the leader's disk (its fsync and the followers' overlap; the
commit never passes the leader's durable end), and commit-offset updates. The stream's
task sleeps on one future that the channel's notify, a new group's write and the
follower's acks resolve (no task per wait); over the replication port those wakers
write an idle follower's cached records and due commit updates themselves, and the task
sleeps on (LeaderStream). The follower hands what it
receives to its core as it arrives (FollowerStream; core.apply: every entry checked by
replication_rules.check_entry, stored with the same step as a catch-up copy), and acks
once it is synced. Who leads or
follows, each follower's acknowledged end and the commit offset are the core's.

The quorum lease (a leader cut off from its followers reports itself unhealthy) needs
each follower heard within --quorum-lease on every pchannel it follows, also an idle one.
Idle time ticks used to provide that, one replicated record per pchannel per interval;
now ticks are written only for readers that want them (Wal._tick_idle_channels), and a
follower node sends one heartbeat ack per leader node every quarter lease instead (on
one of its streams to that leader, `beat`): the leader takes it as word from that node
on every pchannel whose stream from it is open (health.heard_at). Its cost follows the
nodes, not the pchannels (issue 24, docs/decisions-scale.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import Gauge

from streamwal import protowire
from streamwal.errors import (
    ChannelFenced,
    InvalidArgument,
    StreamingError,
    UnmatchedChannelTerm,
)
from streamwal.logs import Repeats
from streamwal.node import records
from streamwal.node import replication_rules as rules
from streamwal.node.channel import Channel
from streamwal.node.core import Entry, Following, Leading
from streamwal.node.health import heard_at, quorum_contact
from streamwal.node.replication_links import QUEUE, Link, open_link
from streamwal.node.steps import Drive
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.node.wal import Wal

log = logging.getLogger("streamwal.node.replication")
_REPEATS = Repeats()  # a leader down: its followers retry every 2 s, logged every 10 s

WINDOW_BYTES = 8 * 1024 * 1024  # record bytes sent to a follower and not yet acknowledged
READ_RECORDS = 1024  # records per read step of a follower's stream (also byte-bounded)
READ_BYTES = 1024 * 1024
APPLY_BYTES = 8 * 1024 * 1024  # a follower syncs and acks at least this often
BACKOFF = (0.05, 2.0)  # a follower's reconnect delay: first, maximum
COMMIT_LAG_S = 0.02  # a commit update waits this long for a record to carry it
# Where a leader's stream writes a LogEntry (or one serialized already): a gRPC context's
# `write` (its serializer passes bytes through) or the replication port's.
Write = Callable[[pb.LogEntry | bytes], Awaitable[None]]


def _history(starts) -> list[tuple[int, int]]:
    return [(t.term, t.first_offset) for t in starts]


def _starts(history) -> list[pb.TermStart]:
    return [pb.TermStart(term=t, first_offset=f) for t, f in history]


class Replication:
    """The replication streams of one node's pchannels, owned by its Wal. The roles, the
    followers' acknowledged ends and the commit offset are the cores' (core.py); this
    keeps what only a process has: the follower tasks and their last write, when each
    follower was last heard (the quorum lease), the commit waiters' futures, metrics."""

    def __init__(self, wal: Wal, node_id: int) -> None:
        self.wal = wal
        self.node_id = node_id
        self._saved_commit: dict[str, int] = {}
        self._following: dict[str, tuple[Following, asyncio.Task]] = {}
        self._writing: dict[str, asyncio.Future] = {}  # a follower's last synced write
        # A leader's role, when it began and when each follower was last heard (monotonic).
        self._heard: dict[str, tuple[Leading, float, dict[int, float]]] = {}
        self._waiters: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        # Leader side: when each follower node was last heard on any stream (monotonic),
        # and the open streams per (pchannel, follower node).
        self._node_heard: dict[int, float] = {}
        self._open: collections.Counter[tuple[str, int]] = collections.Counter()
        # Follower side: each pchannel's following stream.
        self._streams: dict[str, FollowerStream] = {}
        self._beats = 0  # rotates the stream a heartbeat goes on
        # (pchannel, follower node): its replica_acked and replica_lag gauges' children.
        self._gauges: dict[tuple[str, int], tuple[Gauge, Gauge]] = {}

    # -- the cores' effects --------------------------------------------------------------

    def close(self) -> None:
        """The node stops: every follower stream ends, every commit waiter fails."""
        for _, task in self._following.values():
            task.cancel()
        self._following.clear()
        self.answer(tuple(self._waiters), ChannelFenced("the node is shutting down"))

    def start_following(self, ch: Channel, role: Following) -> None:
        task = asyncio.get_running_loop().create_task(
            self._follow(ch, role), name=f"follow-{ch.name}"
        )
        self._following[ch.name] = (role, task)
        self.publish(ch)

    def stop_following(self, ch: Channel, role: Following) -> None:
        current = self._following.get(ch.name)
        if current is not None and current[0] is role:
            del self._following[ch.name]
            current[1].cancel()
            log.info("replica role ended", extra={"pchannel": ch.name, "term": role.term})
        self.publish(ch)

    async def settle(self, ch: Channel) -> None:
        """Wait for the last write of a stopped follower (its task was cancelled, the
        write in the worker thread goes on): the state it already shows must be durable."""
        writing = self._writing.get(ch.name)
        if writing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(writing)

    def wrote(self, ch: Channel, write: asyncio.Future) -> None:
        """A synced write of copied records (a Fence waits for it: `settle`)."""
        self._writing[ch.name] = write

    def answer(self, tokens: tuple[int, ...], error: StreamingError | None = None) -> None:
        for token in tokens:
            future = self._waiters.pop(token, None)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def wait_commit(self, ch: Channel, term: int, end: int) -> asyncio.Future:
        """Resolves once offsets below `end` are committed under `term`; fails if the
        channel's leader role for that term ended (fenced, removed)."""
        token = next(self._tokens)
        future = self._waiters[token] = asyncio.get_running_loop().create_future()
        self.wal.effects(ch, ch.core.wait_commit(term, end, token))
        return future

    def needs_quorum(self, ch: Channel, level: int) -> bool:
        role = ch.core.role
        return isinstance(role, Leading) and rules.quorum_ack(level, len(role.members))

    def persist_commit(self, ch: Channel, wb) -> None:
        """Lazily: the commit offset rides along with the next group commit."""
        if ch.commit is not None and self._saved_commit.get(ch.name) != ch.commit:
            self.wal.store.put_commit(wb, ch.name, ch.commit)
            self._saved_commit[ch.name] = ch.commit

    def publish(self, ch: Channel) -> None:
        m = self.wal.metrics
        role = ch.core.role
        m.role.labels(ch.name, "leader").set(int(isinstance(role, Leading)))
        m.role.labels(ch.name, "follower").set(int(isinstance(role, Following)))
        self._publish_acks(ch)

    def _publish_acks(self, ch: Channel) -> None:
        """Each follower's acknowledged end and lag, on every ack: through the gauges'
        children kept here (looking them up by labels each time cost ~17 us an ack)."""
        role = ch.core.role
        if not isinstance(role, Leading):
            return
        m = self.wal.metrics
        for node in role.follower_ids(self.node_id):
            gauges = self._gauges.get((ch.name, node))
            if gauges is None:
                labels = (ch.name, str(node))
                gauges = m.replica_acked.labels(*labels), m.replica_lag.labels(*labels)
                self._gauges[(ch.name, node)] = gauges
            acked = role.acked.get(node, 0)
            gauges[0].set(acked)
            gauges[1].set(max(0, ch.committed_next - acked))

    def lead(self, ch: Channel) -> None:
        """After an Assign: a new leader role gives its followers a lease from now to
        connect; members added under the same term get one from the role's start."""
        role = ch.core.role
        if isinstance(role, Leading):
            self._lease(ch, role)
        else:
            self._heard.pop(ch.name, None)
        self.publish(ch)

    def _lease(self, ch: Channel, role: Leading) -> dict[int, float]:
        """When each follower of `role` was last heard."""
        held = self._heard.get(ch.name)
        if held is None or held[0] is not role:
            held = self._heard[ch.name] = (role, time.monotonic(), {})
        _, started, heard = held
        for node in role.follower_ids(self.node_id):
            heard.setdefault(node, started)
        return heard

    def quorum_lost(self, ch: Channel) -> str:
        """Why `ch`'s leader role lacks a majority within its lease ("": it does not)."""
        role = ch.core.role
        if not isinstance(role, Leading):
            return ""
        heard = self._lease(ch, role)
        lease = self.wal.config.quorum_lease_s
        now = time.monotonic()
        followers = role.follower_ids(self.node_id)
        at = {
            n: heard_at(heard[n], self._node_heard.get(n), self._open[(ch.name, n)] > 0)
            for n in followers
        }
        if quorum_contact(at.values(), len(role.members), now, lease):
            return ""
        ages = ", ".join(f"node {n}: {now - at[n]:.1f}s ago" for n in followers)
        return f"the leader heard from no majority of its replicas within {lease}s ({ages})"

    # -- leader side -------------------------------------------------------------------

    def open_stream(
        self,
        first: pb.ReplicaAck,
        write: Write,
        transport: str,
        write_now: Callable[[bytes], bool] | None = None,
    ) -> LeaderStream:
        """One follower's stream from its first ack (raises the StreamingError to refuse
        it with); its entries go to `write` (and to `write_now`, which writes one only if
        the transport takes it at once: LeaderStream), its later acks to
        `LeaderStream.take`. `transport` ("port" or "grpc") is logged: which one a
        follower took."""
        ch = self.wal.channels.get(first.pchannel)
        if ch is None:
            raise ChannelFenced(f"pchannel {first.pchannel!r} is not led by this node")
        start = ch.core.open_stream(
            first.node_id, first.term, _history(first.term_history), first.acked_offset
        )
        role = ch.core.role
        assert isinstance(role, Leading)
        log.info(
            "follower connected",
            extra={
                "pchannel": ch.name,
                "follower": first.node_id,
                "acked": first.acked_offset,
                "from": start.position,
                "truncate_from": start.truncate_from,
                "transport": transport,
            },
        )
        self._lease(ch, role)[first.node_id] = self._node_heard[first.node_id] = time.monotonic()
        return LeaderStream(self, ch, role, first.node_id, start, write, first.batched, write_now)

    async def serve(self, stream: LeaderStream, acks: AsyncIterator | None = None) -> None:
        """Run `stream` until it ends: raises the StreamingError to abort it with. `acks`:
        the follower's (a gRPC request iterator, read by a task); None: the transport
        hands them to `stream.take` itself (the replication port, as bytes arrive)."""
        key = (stream.ch.name, stream.node)
        self._open[key] += 1
        reader = None if acks is None else asyncio.ensure_future(stream.feed(acks))
        try:
            await stream.run()
        finally:
            if reader is not None:
                reader.cancel()
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]

    def acked(self, ch: Channel, role: Leading, node: int, end: int, sent: int) -> None:
        """A follower's ReplicaAck: it holds everything below `end` (of what was `sent`)."""
        self._lease(ch, role)[node] = self._node_heard[node] = time.monotonic()
        self.wal.effects(ch, ch.core.acked(node, role.term, end, sent))
        self._publish_acks(ch)  # an ack changes no role

    # -- follower side -----------------------------------------------------------------

    async def beat_loop(self) -> None:
        """Every quarter lease, one heartbeat ack to each leader node this node follows."""
        while True:
            await asyncio.sleep(self.wal.config.quorum_lease_s / 4)
            self.beat()

    @property
    def following(self) -> bool:
        """Whether this node follows some pchannel (its loop owes those leaders heartbeats)."""
        return bool(self._streams)

    def beat(self) -> None:
        """A heartbeat on one following stream per leader node, rotating; written at once,
        even while the stream waits for its disk (`FollowerStream.beat`)."""
        self._beats += 1
        by_leader: dict[int, list[FollowerStream]] = {}
        for stream in self._streams.values():
            by_leader.setdefault(stream.role.leader.node_id, []).append(stream)
        for streams in by_leader.values():
            streams[self._beats % len(streams)].beat()

    async def _follow(self, ch: Channel, role: Following) -> None:
        """Stream from the leader while the role lasts, reconnecting with backoff."""
        delay = BACKOFF[0]
        while ch.core.role is role:
            before = ch.committed_next
            try:
                await self._follow_once(ch, role)
            except asyncio.CancelledError:
                raise
            except (StreamingError, rules.Rejected) as err:
                _REPEATS.log(
                    log,
                    logging.WARNING,
                    "replication stream ended",
                    (ch.name, role.leader.address),
                    pchannel=ch.name,
                    leader=role.leader.address,
                    error=str(err),
                )
            except Exception as err:  # a bug must not end following for good
                log.exception("replication stream failed", extra={"error": repr(err)})
            if ch.committed_next > before:
                delay = BACKOFF[0]
                _REPEATS.forget((ch.name, role.leader.address))
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF[1])

    def ack(self, ch: Channel, role: Following, end: int, first: bool = False) -> pb.ReplicaAck:
        """A ReplicaAck: this follower holds (synced) everything below `end`."""
        return pb.ReplicaAck(
            pchannel=ch.name,
            term=role.term,
            node_id=self.node_id,
            replica=role.ordinal,
            acked_offset=end,
            term_history=_starts(ch.meta.history) if first else (),
            batched=first,
        )

    async def _follow_once(self, ch: Channel, role: Following) -> None:
        link = await open_link(role.leader.address)
        stream = FollowerStream(self, ch, role, link)
        try:
            link.send(self.ack(ch, role, ch.committed_next, first=True))
            self._streams[ch.name] = stream  # heartbeats after the first ack
            link.start(stream.offer)
            await stream.done
        finally:
            stream.close()
            if self._streams.get(ch.name) is stream:
                del self._streams[ch.name]
            await link.close()


def entries(got: list[pb.LogEntry]) -> list[Entry]:
    """A leader's LogEntries as the core applies them (core.apply): one Entry a record."""
    out: list[Entry] = []
    for e in got:
        cut = e.truncate_from if e.HasField("truncate_from") else None
        out.append(Entry(e.term, e.offset, e.record, cut, e.commit_offset))
        offset = e.offset + (records.peek(e.record)[2] if e.record else 0)
        for value in e.next_records:
            out.append(Entry(e.term, offset, value, None, e.commit_offset))
            offset += records.peek(value)[2]
    return out


class FollowerStream:
    """A follower's half of one Replicate stream: what the link receives is applied as it
    arrives, in order, one batch at a time (up to APPLY_BYTES; what arrives meanwhile
    waits for the next), and acknowledged once durable.

    The core's steps are driven from callbacks (steps.Drive): over the replication port
    a one-at-a-time send is applied in the socket's `data_received` and acknowledged from
    its synced write's done callback, with no task woken; only a step that waits in its
    own way (a cut of a divergent suffix) goes to a task. The follower's task
    (`Replication._follow_once`) only opens the stream and waits for its end (`done`):
    the error it ended with (a rejected entry, a term mismatch, a disk error, the
    leader's), or None when the role ended."""

    def __init__(self, repl: Replication, ch: Channel, role: Following, link: Link) -> None:
        self.repl = repl
        self.ch = ch
        self.role = role
        self.link = link
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._backlog: collections.deque = collections.deque()  # received, not applied
        self._applying: Drive | None = None
        self._end: BaseException | None = None  # ends the stream once its batch is applied
        self._owed = False  # a batch changed the log: acknowledge before the next one
        # The end last acknowledged after an applied batch (None: none applied yet).
        self._acked: int | None = None
        self._running = False  # `_next` is on the stack: it goes on by itself

    def offer(self, got: list) -> bool:
        """The link's sink: LogEntries, and last the exception the stream ended with."""
        if not self.done.done():
            self._backlog.extend(got)
            self._next()
        return len(self._backlog) < QUEUE

    def beat(self) -> None:
        """A heartbeat, written at once, also while a batch waits for the disk: the
        leader's quorum lease is about reaching its followers, not their disks' speed (a
        follower whose disk stalls is slow, not gone). It repeats the end last
        acknowledged after an applied batch, never the log's end of the moment: that
        counts a batch still on its way to the disk, or, before the stream's first batch
        (only a stream's first entry may cut), a suffix the leader's log does not have.
        Before the first batch it says nothing: the leader heard the first ack just now."""
        if self._acked is not None and not self.done.done() and self.ch.core.role is self.role:
            self._send(self._acked)

    def close(self) -> None:
        """The stream is over: a write under way goes on (`Replication.settle`), nothing
        after it is done."""
        if not self.done.done():
            self.done.set_result(None)
        elif not self.done.cancelled():
            self.done.exception()  # retrieved: a stream ended by its task's cancel
        if self._applying is not None:
            self._applying.cancel()

    def _finish(self, err: BaseException | None) -> None:
        if not self.done.done():
            if err is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(err)

    def _next(self) -> None:
        """Apply the next batch, and the ones after it that need no waiting."""
        if self._running:
            return
        self._running = True
        try:
            while self._applying is None and not self.done.done():
                if self.ch.core.role is not self.role:
                    self._finish(None)
                elif self._owed:  # before the next batch: nothing is on its way to disk
                    self._owed = False
                    self._acked = self.ch.committed_next
                    self._send(self._acked)
                elif self._end is not None:
                    self._finish(self._end)
                elif self._backlog:
                    self._apply(self._take())
                else:
                    break
        except Exception as exc:  # a bug ends this stream (its task logs it), not following
            self._finish(exc)
        finally:
            self._running = False

    def _take(self) -> list[pb.LogEntry]:
        """The next batch, up to APPLY_BYTES (at least one entry); the stream's end is
        kept for after it."""
        got: list[pb.LogEntry] = []
        size = 0
        while self._backlog and (not got or size < APPLY_BYTES):
            item = self._backlog.popleft()
            if isinstance(item, BaseException):
                self._end = item
                self._backlog.clear()
                break
            got.append(item)
            size += len(item.record) + sum(map(len, item.next_records))
        if len(self._backlog) < QUEUE:
            self.link.took()
        return got

    def _apply(self, got: list[pb.LogEntry]) -> None:
        if not got:
            return
        ch = self.ch
        drive = self._applying = Drive(
            ch.core.apply(entries(got)), self.repl.wal.stepper(ch), self._applied
        )
        drive.start()

    def _applied(self, changed: bool, err: BaseException | None) -> None:
        """The core applied a batch: True when the log changed (durable now)."""
        self._applying = None
        if err is not None:
            self._finish(err)
            return
        if changed:
            self._owed = True
        elif self._acked is None:
            self._acked = self.ch.committed_next  # the first batch cut and stored nothing
        self._next()

    def _send(self, end: int) -> None:
        try:
            self.link.send(self.repl.ack(self.ch, self.role, end))
        except StreamingError as err:
            self._finish(err)


def term_error(pchannel: str, theirs: int, ours: int) -> StreamingError:
    return UnmatchedChannelTerm(
        f"replication of {pchannel!r} under term {theirs} refused: the leader's term is {ours}"
    )


class LeaderStream:
    """The leader's half of one follower's Replicate stream, whatever carries it: entries
    go out through `write` (a gRPC stream's, or the replication port's), acks come in
    through `take` and the end through `end`.

    What the stream does next is decided in one place (`_next`), by its task (`run`) or
    by its waker (`poke`): with a `write_now` (the replication port's, which writes a
    frame when the socket takes it at once) a waker that finds records in the tail cache
    for an idle follower, or a commit update due, writes it there and then, and the task
    stays asleep. A one-at-a-time send then costs the leader no task wake-up per
    follower, and its records are in the followers' sockets before its own fsync starts
    (`Wal._prepare`). Everything that must wait (RocksDB reads, a full socket, the role's
    or the stream's end) is the task's, as before."""

    def __init__(
        self,
        repl: Replication,
        ch: Channel,
        role: Leading,
        node: int,
        start: rules.Start,
        write: Write,
        batched: bool = False,
        write_now: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.repl = repl
        self.batched = batched  # the follower applies LogEntry.next_records
        self.ch = ch
        self.role = role
        self.node = node
        self.start = start
        self.write = write
        self.write_now = write_now
        self.position = start.position
        self.window: collections.deque[tuple[int, int]] = collections.deque()
        self.inflight = 0
        self.sent_commit = -1  # the commit offset the follower was last sent
        self.commit_due = 0.0  # when a commit update goes out alone (loop time; 0: none due)
        self._loop = asyncio.get_running_loop()
        self._wake: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # Set once the follower's side ended: (None,) closed, (error,) misbehaved or broke.
        self.ended: tuple[BaseException | None] | None = None

    def poke(self) -> bool:
        """Something the stream may act on changed (records, commit, acks, role, end).
        True when nothing is left for its task: it was not asleep (it re-checks all of
        this before it sleeps again), or this did what there was to do."""
        wake = self._wake
        if wake is None or wake.done():
            return True
        # An error here (the role or the stream ended) is the task's to end the stream with.
        with contextlib.suppress(Exception):
            if self.write_now is not None and self._act_now():
                return True
        wake.set_result(None)
        return False

    def _entry(self, **fields) -> pb.LogEntry:
        return pb.LogEntry(term=self.role.term, commit_offset=self.ch.known_commit, **fields)

    def _next(self, now: float) -> tuple[str, int | float]:
        """What the stream does next: ("send", end) the records from `position` below
        `end`, ("commit", 0) a commit update alone, ("sleep", seconds) nothing yet.
        Raises the error the stream ends with; ("end", 0): the follower closed it."""
        ch, role = self.ch, self.role
        if ch.core.role is not role:
            raise ChannelFenced(f"{ch.name!r}: leader role ended")
        if self.ended is not None:
            if self.ended[0] is not None:
                raise self.ended[0]
            return "end", 0
        acked = role.acked.get(self.node, 0)
        while self.window and self.window[0][0] <= acked:
            self.inflight -= self.window.popleft()[1]
        # Records on their way to the leader's disk go out at once to a follower that
        # holds everything sent (one-at-a-time sends: the fsyncs overlap); to a busy one
        # once durable, in bigger pieces: under load the per-batch costs, not the fsync,
        # bound the rate (measured: docs/benchmarks.md).
        end = self.repl.wal.sendable_end(ch) if not self.inflight else ch.committed_next
        if self.position < end and self.inflight < WINDOW_BYTES:
            return "send", end
        if ch.known_commit == self.sent_commit:
            return "sleep", 1.0
        # Alone, a commit update waits COMMIT_LAG_S for records to ride on: a one-at-a-
        # time producer's next record carries it, and each follower is woken once per
        # send, not twice.
        self.commit_due = self.commit_due or now + COMMIT_LAG_S
        if now >= self.commit_due:
            return "commit", 0
        return "sleep", self.commit_due - now

    def _sent(self, commit: int) -> None:
        self.sent_commit, self.commit_due = commit, 0.0

    def _act_now(self) -> bool:
        """`_next` from the waker, writing with `write_now`: True when it is all done (or
        nothing is to do), False (or an exception) when the task must act (a read from
        RocksDB, a socket that does not take the frame at once, the end of the stream)."""
        assert self.write_now is not None
        loop = self._loop
        for _ in range(4):  # a read step at a time; a longer backlog is the task's
            action, arg = self._next(loop.time())
            if action == "sleep":
                self._arm(loop, arg)
                return True
            if action == "commit":
                commit = self.ch.known_commit
                if not self.write_now(self._entry(offset=self.position).SerializeToString()):
                    return False
                self._sent(commit)
            elif action == "send":
                recs = self.repl.wal.cached_raw(
                    self.ch, self.position, READ_RECORDS, READ_BYTES, int(arg)
                )
                recs = [(b, v) for b, v in recs or () if b >= self.position]  # never split
                if not recs or not self.batched:
                    return False
                commit = self.ch.known_commit
                entry = protowire.log_entry(
                    self.role.term, commit, recs[0][0], [v for _, v in recs]
                )
                if not self.write_now(entry):
                    return False
                self._advance(recs)
                self._sent(commit)
            else:
                return False
        return False

    def _arm(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        """A poke `seconds` from now at the latest (the 1 s bound, or a commit update's)."""
        at = loop.time() + seconds
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(at, self._tick), at

    def _tick(self) -> None:
        self._timer = None
        self.poke()

    async def run(self) -> None:
        ch, loop = self.ch, self._loop
        ch.wakers.append(self.poke)
        try:
            first = self._entry(offset=self.position, term_history=_starts(ch.meta.history))
            if self.start.truncate_from is not None:
                first.truncate_from = self.start.truncate_from
            await self.write(first)
            self._sent(first.commit_offset)
            while True:
                action, arg = self._next(loop.time())
                if action == "end":
                    return  # the follower closed its stream
                if action == "send" and await self._send_records(int(arg)):
                    continue
                if action == "commit":
                    commit = ch.known_commit
                    await self.write(self._entry(offset=self.position))
                    self._sent(commit)
                    continue
                # Every await above re-checks all of this: a poke while none waits is moot.
                self._arm(loop, arg if action == "sleep" else 1.0)
                self._wake = loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
        finally:
            ch.wakers.remove(self.poke)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _advance(self, recs: list[tuple[int, bytes]]) -> None:
        """`recs` are on their way: the follower's ack of them may be read while the write
        is still awaited, and an ack above `position` is clipped."""
        for base, value in recs:
            self.position = base + records.peek(value)[2]
            self.window.append((self.position, len(value)))
            self.inflight += len(value)

    async def _send_records(self, end: int) -> bool:
        """The records from `position` below `end`, in one entry to a follower that takes
        batches (else one entry each); False when none could be read yet (a group on its
        way to the disk that the cache no longer holds)."""
        recs = await self.repl.wal.read_raw(self.ch, self.position, READ_RECORDS, READ_BYTES, end)
        recs = [(base, value) for base, value in recs if base >= self.position]  # never split
        if not recs:
            return False
        self._advance(recs)  # before the write (see `_advance`)
        # Serialized here (both transports pass bytes through): one copy of the records,
        # not protobuf's two (protowire.log_entry).
        term, commit = self.role.term, self.ch.known_commit
        if self.batched:
            values = [value for _, value in recs]
            await self.write(protowire.log_entry(term, commit, recs[0][0], values))
        else:
            for base, value in recs:
                await self.write(protowire.log_entry(term, commit, base, (value,)))
        self._sent(commit)
        return True

    def take(self, ack: object) -> bool:
        """One follower ack; False once the stream is over (it misbehaved, or ended)."""
        if self.ended is not None:
            return False
        if not isinstance(ack, pb.ReplicaAck):
            self.end(InvalidArgument(getattr(ack, "reason", "malformed ReplicaAck")))
            return False
        if ack.term != self.role.term or ack.node_id != self.node:
            self.end(term_error(self.ch.name, ack.term, self.role.term))
            return False
        if ack.replay:  # resend from what the follower holds
            self.position = min(self.position, ack.acked_offset)
            self.window.clear()
            self.inflight = 0
        self.repl.acked(self.ch, self.role, self.node, ack.acked_offset, self.position)
        self.poke()
        return True

    def end(self, err: BaseException | None) -> None:
        """The follower's side ended: closed (None) or broken (the error to end with)."""
        if self.ended is None:
            self.ended = (err,)
            self.poke()

    async def feed(self, acks: AsyncIterator) -> None:
        """A gRPC stream's acks into `take` until the follower closes it."""
        try:
            async for ack in acks:
                if not self.take(ack):
                    return
            self.end(None)
        except Exception as exc:  # the call broke: the stream ends with it
            self.end(exc)
