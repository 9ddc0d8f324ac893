"""One pchannel on one node as a pure state machine: inputs in, effects out.

`PChannelCore` owns everything the node decides about one pchannel: the accepted term and
the fence (serving, recovering after a restart, taking a higher term), offsets (handed
out, durable, first retained), the commit offset and who waits for it, the term history,
the idempotent producers' windows, the replication role, and what it knows of damage
(acknowledged records the log lacks). It does no I/O, reads no clock and starts no task:
time comes in as `now_ms`, persisted windows through a lookup function, and everything
the outside must do comes out as effects, as etcd's raft hands out a Ready (entries to
persist, messages to send) and is told when they are done.

Inputs: `access` (may a client use term T?), `append` (allocate offsets and ticks),
`written` / `write_failed` (the group commit's outcome), `assign`, `fence` and `remove`
(generators: they yield the steps that need I/O -- drain, catch up, truncate, persist the
meta -- and get each step's outcome back), `open_stream` / `acked` (a follower of this
leader connects, acknowledges), `apply` (a follower's entries from its leader, also a
generator), `store` / `copy` (records copied from elsewhere), `wait_commit`, `idle`,
`retained` (retention cut the front), `evict_idle` / `forget_cut` (producer windows
leave memory, or go with a retention cut), `durable` (the ledger's periodic sync), `skip` (an
unclean stop under async durability), `found_damage` / `rebuild`.

`advance` runs an input's steps against a driver's I/O, by plain calls until a step must
be waited for: the node's `Wal` (node/wal.py, through node/steps.py) and the simulator's
`SimNode` (testing/sim/node.py) are the two drivers.

Effects: `PersistMeta`, `MarkDurable` (the acknowledged-offset ledger), `Answer` / `Fail`
(commit waiters), `StartFollowing` / `StopFollowing`, `AppendTick` (a new leader's first
record), `Notify` (wake consumers and streams), and the steps `Drain`, `Verify`,
`CatchUp`, `Truncate`, `Store`.

Every input that moves an offset, the commit or the term ends with `check()`: first <=
durable <= next, the commit never moves back and never passes the durable end, terms
never decrease (`append` only raises `next_offset`; its `written` checks). The rules
themselves live in the pure modules this one sequences: fencing.py, replication_rules.py,
divergence.py, producers.py, clock.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from streamwal.errors import (
    ChannelFenced,
    DataLoss,
    IgnoredOperation,
    InvalidArgument,
    StreamingError,
    UnmatchedChannelTerm,
)
from streamwal.node import fencing, records
from streamwal.node import replication_rules as rules
from streamwal.node.channel_meta import ChannelMeta, Tail
from streamwal.node.clock import BarrierTooFar, HybridClock
from streamwal.node.divergence import cut_history, extend_history
from streamwal.node.fencing import (
    AssignOutcome,
    Fence,
    check_access,
    decide_assign,
    decide_remove,
)
from streamwal.node.producers import (
    BatchResult,
    Duplicate,
    ProducerState,
    check_sequence,
    cut_producers,
    idle_producers,
)
from streamwal.proto import streaming_pb2 as pb

# ----------------------------------------------------------------- roles


@dataclass(frozen=True)
class Peer:
    """Another node of the replica set."""

    node_id: int
    address: str


@dataclass
class Leading:
    """This node leads the pchannel under `term`: each follower's acknowledged end."""

    term: int
    members: list[Peer]
    term_start: int  # the log end when this term began (commit rule)
    acked: dict[int, int] = field(default_factory=dict)  # follower node -> acked end

    def follower_ids(self, self_id: int) -> list[int]:
        return [m.node_id for m in self.members if m.node_id != self_id]


@dataclass(frozen=True)
class Following:
    """This node follows `leader` under `term`; `ordinal` is its index in the set."""

    term: int
    leader: Peer
    ordinal: int


Role = Leading | Following


@dataclass(frozen=True)
class ReplicaSet:
    """An Assign's replica set, parsed: the role given to this node and every member."""

    leading: bool
    members: tuple[Peer, ...]
    leader: Peer | None = None  # a follower's leader


# ----------------------------------------------------------------- effects and steps


@dataclass(frozen=True)
class PersistMeta:
    """Write the meta durably; the input goes on once it is written."""

    meta: ChannelMeta


class MarkDurable(NamedTuple):
    """The log is durable up to `end`: the acknowledged-offset ledger may say so. (A
    NamedTuple, as `Accepted`: one is made per append, and a frozen dataclass's
    __init__ costs several times a tuple's.)"""

    end: int


@dataclass(frozen=True)
class Answer:
    """Commit waiters whose batch is now committed (tokens from `wait_commit`)."""

    tokens: tuple[Any, ...]


@dataclass(frozen=True)
class Fail:
    """Commit waiters that will never be answered (the role ended)."""

    tokens: tuple[Any, ...]
    error: StreamingError


@dataclass(frozen=True)
class StartFollowing:
    role: Following


@dataclass(frozen=True)
class StopFollowing:
    """End the follower stream of `role`; the driver settles its last write first."""

    role: Following


@dataclass(frozen=True)
class AppendTick:
    """A new leader's first record (a time tick of its term): committing it commits the
    older terms' records below it (replication_rules.commit_offset)."""

    term: int


@dataclass(frozen=True)
class Notify:
    """Wake consumers and streams waiting on the pchannel (data or fence moved)."""


_NOTIFY = Notify()
_NOTIFY_ONLY: tuple[Effect, ...] = (_NOTIFY,)


@dataclass(frozen=True)
class Drain:
    """Step: wait until everything accepted is durable or failed (`drained`)."""


@dataclass(frozen=True)
class Verify:
    """Step: verify what an earlier process wrote before it is led or reported; the
    outcome is (offset, reason) of the first unreadable record, or None."""


@dataclass(frozen=True)
class CatchUp:
    """Step: copy what this node lacks from `source` (feeding `copy`, cutting a divergent
    suffix through `truncate` first); the outcome is None or the error."""

    source: str


@dataclass(frozen=True)
class Truncate:
    """Step: drop the log from `offset` (and the producer windows' batches there); the
    outcome is (bytes dropped, the last record's term after the cut)."""

    offset: int
    divergent: bool = True  # False: a damaged suffix (the ledger's mark stays)


@dataclass(frozen=True)
class Staged:
    """What the state was before copied records were applied (see `Store`)."""

    first_offset: int
    next_offset: int
    committed_next: int
    size_bytes: int
    last_term: int
    history: list[tuple[int, int]]
    commit: int | None
    end: int  # the log end the copies brought


@dataclass(frozen=True)
class Store:
    """Step: write copied records with `meta`, the size and commit, synced; the outcome
    is None once durable (then the follower acknowledges). If the write fails, the
    driver calls `unstore(staged)` -- whoever was waiting for it, also when the stream
    that asked for it was stopped meanwhile (a fence settles the write, not its result)."""

    records: tuple[tuple[int, bytes], ...]
    meta: ChannelMeta
    windows: tuple[tuple[str, bytes], ...]  # producer id -> window as persisted
    commit: int | None
    staged: Staged | None = None


Effect = (
    PersistMeta
    | MarkDurable
    | Answer
    | Fail
    | StartFollowing
    | StopFollowing
    | AppendTick
    | Notify
    | Drain
    | Verify
    | CatchUp
    | Truncate
    | Store
)
Steps = Generator[Effect, Any, Any]


class Accepted(NamedTuple):
    """An append's offsets and ticks: write the record, then report `written`."""

    base: int
    first_tick: int


@dataclass(frozen=True)
class Resend:
    """An idempotent producer's batch appended before: answer with `result` (once the
    original is durable, when `in_flight`), never append it again."""

    result: BatchResult
    in_flight: bool


@dataclass(frozen=True)
class Entry:
    """One LogEntry from the leader: a record at `offset`, a cut, a commit update."""

    term: int
    offset: int = 0
    record: bytes = b""
    truncate_from: int | None = None
    commit_offset: int = 0


@dataclass(frozen=True)
class Pending:
    """A step's outcome is not at hand: it comes from `wait` (node/steps.py): a future
    (work under way that others may share, a synced write: waiting never cancels it) or
    a coroutine (a wait of the step's own: a read, a cut in a worker thread, a drain)."""

    wait: Awaitable[Any]


def advance(
    steps: Steps,
    step: Callable[[Effect], Any],
    sent: Any = None,
    error: StreamingError | None = None,
) -> tuple[bool, Any]:
    """Run an input's steps by plain calls, from `sent` (or `error`, thrown in), while
    each one's outcome is at hand: `step` does its I/O and returns the outcome, or
    Pending. Returns (True, the input's result) once the steps end, or (False, what to
    wait for) at the first Pending; the outcome then goes back in through the next call.
    A StreamingError a step raises goes back to the core (to undo or pass on), anything
    else ends the input. The one loop of the node's drivers (node/steps.py) and the
    simulator's."""
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(sent)
        except StopIteration as done:
            return True, done.value
        try:
            sent, error = step(effect), None
        except StreamingError as exc:
            sent, error = None, exc
        if isinstance(sent, Pending):
            return False, sent.wait


def parse_replica_set(rs: pb.ReplicaSet | None, node_id: int) -> ReplicaSet | None:
    """An Assign's replica set, or None for the single-replica behaviour; raises on a
    replica set this node cannot act on (checked before anything is persisted)."""
    if rs is None or not rs.members:
        return None
    members = tuple(Peer(m.server_id, m.address) for m in rs.members)
    ids = [m.node_id for m in members]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"replica set names a node twice: {ids}")
    if node_id not in ids:
        raise InvalidArgument(f"replica set {ids} does not include this node ({node_id})")
    if rs.role == pb.REPLICA_ROLE_FOLLOWER:
        if not rs.leader.address or rs.leader.server_id == node_id:
            raise InvalidArgument("a follower's replica set needs its leader (another node)")
        return ReplicaSet(False, members, Peer(rs.leader.server_id, rs.leader.address))
    if rs.role != pb.REPLICA_ROLE_LEADER:
        raise InvalidArgument(f"unknown replica role {rs.role}")
    return ReplicaSet(True, members)


class InvariantBroken(AssertionError):
    """A state no input may produce: a bug, never an operating error."""


class PChannelCore:
    """One pchannel on one node (see the module docstring)."""

    def __init__(
        self,
        name: str,
        node_id: int,
        meta: ChannelMeta,
        tail: Tail,
        commit: int | None = None,
        load_window: Callable[[str], bytes | None] = lambda _: None,
        known: bool = True,
        ledger_mark: int = 0,
    ) -> None:
        """`known`: the node holds a meta of the pchannel (False: a name it never saw);
        `ledger_mark`: the acknowledged-offset ledger's mark when the node started."""
        self.name = name
        self.known = known
        self.node_id = node_id
        self.meta = meta
        self.recovering = meta.serving  # a reopened pchannel waits for its Assign
        self.taking = 0  # a higher term being taken: nobody is served meanwhile
        self._now_ms = 0
        self.clock = HybridClock(lambda: self._now_ms)
        self.clock.observe(tail.last_tick)
        self.first_offset = tail.first_offset
        # A term may start above the last record (an unclean move, an accepted loss).
        end = max([tail.next_offset, *(first for _, first in meta.history)])
        self.next_offset = end  # next offset to hand out
        self.committed_next = end  # everything below is durable
        self.size_bytes = tail.size_bytes
        self.last_term = tail.last_term
        self.commit = commit  # None: a single replica, everything durable is committed
        self.role: Role | None = None
        self.last_append_ms = 0
        self.producers: OrderedDict[str, ProducerState] = OrderedDict()
        self.in_flight: set[tuple[str, int]] = set()
        self._load_window = load_window
        self._waiters: list[tuple[int, int, Any]] = []
        self._order = itertools.count()
        # Damage: the end this node had acknowledged when it found its log shorter (0:
        # not short), and the first unreadable record with why.
        self.lost_until = 0
        self.bad_from: int | None = None
        self.bad_reason = ""
        self.unverified = False  # an earlier process wrote records nobody verified yet
        self.needs_salvage = False  # the store failed a checksum: salvage.py, not a cut
        self.ledger_mark = ledger_mark  # the highest end this node may have acknowledged
        if self.committed_next < ledger_mark:
            self.lost_until = ledger_mark
        self.unclean_cuts = 0  # cuts below the commit offset (an unclean failover)
        self.unled_term = 0  # a term whose leader role ended on a failed write: never led again
        self._high_term = meta.term
        self._high_commit = commit or 0
        self.check()

    # ----------------------------------------------------------------- views

    @property
    def term(self) -> int:
        return self.meta.term

    @property
    def damage(self) -> str:
        """Why this node's log may lack acknowledged records ("": whole)."""
        return fencing.damage(self.bad_from, self.bad_reason, self.committed_next, self.lost_until)

    @property
    def fence(self) -> Fence:
        following = ""
        if isinstance(self.role, Following):
            leader = self.role.leader
            following = f"node {leader.node_id} at {leader.address}"
        return Fence.of(self.meta, self.recovering, following, self.taking, self.damage)

    @property
    def visible_next(self) -> int:
        """Consumers see offsets below this: durable here and, if replicated, committed."""
        return self.committed_next if self.commit is None else min(self.commit, self.committed_next)

    @property
    def known_commit(self) -> int:
        return self.committed_next if self.commit is None else self.commit

    @property
    def drained(self) -> bool:
        return self.committed_next >= self.next_offset

    @property
    def reported(self) -> bool:
        """Whether CollectStatus reports it: served here (assigned, not recovering)."""
        return self.meta.serving and not self.recovering and self.fence.assigned

    def status(self) -> pb.PChannelStatus:
        """What CollectStatus says of the pchannel (the driver adds its connections)."""
        role = self.role
        out = pb.PChannelStatus(
            pchannel=pb.PChannelInfo(name=self.name, term=self.term),
            first_offset=self.first_offset,
            next_offset=self.committed_next,
            last_time_tick=self.clock.last,
            size_bytes=self.size_bytes,
            data_loss=self.damage,
            role=pb.REPLICA_ROLE_FOLLOWER
            if isinstance(role, Following)
            else pb.REPLICA_ROLE_LEADER,
            last_term=self.last_term,
            commit_offset=self.known_commit,
            retention=pb.RetentionPolicy(
                max_age_ms=self.meta.retention_age_ms, max_bytes=self.meta.retention_bytes
            ),
        )
        if isinstance(role, Leading):
            for node in role.follower_ids(self.node_id):
                acked = role.acked.get(node, 0)
                lag = max(0, self.committed_next - acked)
                out.replicas.append(pb.ReplicaProgress(node_id=node, acked_offset=acked, lag=lag))
        return out

    def check(self) -> None:
        """The invariants every input keeps (TigerBeetle's rule: assert, do not hope)."""
        if not self.first_offset <= self.committed_next <= self.next_offset:
            raise InvariantBroken(
                f"{self.name}: offsets out of order: first {self.first_offset}, durable "
                f"{self.committed_next}, next {self.next_offset}"
            )
        if self.meta.term < self._high_term:
            raise InvariantBroken(f"{self.name}: term went back to {self.meta.term}")
        self._high_term = self.meta.term
        if self.commit is not None:
            if self.commit < self._high_commit:
                raise InvariantBroken(
                    f"{self.name}: commit went back from {self._high_commit} to {self.commit}"
                )
            if self.commit > self.committed_next and isinstance(self.role, Leading):
                raise InvariantBroken(
                    f"{self.name}: leader's commit {self.commit} beyond its durable end "
                    f"{self.committed_next}"
                )
            self._high_commit = self.commit

    # ----------------------------------------------------------------- clients

    def access(self, term: int) -> None:
        """Raises the error a Produce or Consume under `term` must get, if any.

        Every append asks, so the open case -- `term` assigned and served here, nothing
        in the way -- is read off the fields; anything else builds the Fence and lets
        check_access name the error (tests/node/test_core.py checks the two agree)."""
        meta = self.meta
        if (
            term == meta.term == meta.assigned_term
            and meta.serving
            and not self.recovering
            and not self.taking
            and self.bad_from is None
            and self.committed_next >= self.lost_until
            and not isinstance(self.role, Following)
        ):
            return
        check_access(self.fence, self.name, term)

    def append(
        self,
        term: int,
        count: int,
        now_ms: int,
        flags: int = 0,
        producer: tuple[str, int] | None = None,
        barrier_tick: int = 0,
    ) -> Accepted | Resend:
        """Offsets and ticks for `count` messages under `term`; raises if the term may not
        append here. A producer's batch seen before is a Resend."""
        self.access(term)
        self._now_ms = now_ms
        state = None
        if producer is not None:
            state = self.window(producer[0], now_ms)
            try:
                check_sequence(state, producer[1], producer[0])
            except Duplicate as dup:
                return Resend(dup.result, producer in self.in_flight)
        if barrier_tick:
            try:
                self.clock.push_past(barrier_tick)
            except BarrierTooFar as exc:
                raise InvalidArgument(str(exc)) from None
        base = self.next_offset
        self.next_offset = base + count
        first_tick = self.clock.allocate(records.ticks_used(flags, count))
        if not flags & records.INTERNAL_FLAGS:  # cursor records must not hold back ticks
            self.last_append_ms = now_ms
        if producer is not None and state is not None:
            state.add(producer[1], BatchResult(base, first_tick, count))
            self.in_flight.add(producer)
        # No check() here: an append only raises `next_offset` (count >= 0), which keeps
        # every invariant; `written` checks them all once the record is durable.
        return Accepted(base, first_tick)

    def skip(self, end: int, now_ms: int) -> tuple[int, Accepted] | None:
        """Async durability: every offset acknowledged is below `end` (the ledger's
        ceiling), and an unclean stop may have lost some of them. One internal record
        covers the offsets up to `end`, so they are never handed out again and the log
        stays dense; returns its term and offsets (None: no skip is due -- the log
        reaches `end`, the pchannel is replicated, or its log is damaged). Written
        before the pchannel serves, then reported as `written`."""
        if end <= self.committed_next or self.commit is not None or self.damage:
            return None
        self._now_ms = now_ms
        term = self.last_term or (self.meta.history[-1][0] if self.meta.history else 0)
        base = self.next_offset
        self.next_offset = end
        first_tick = self.clock.allocate(1)
        self.check()
        return term, Accepted(base, first_tick)

    def retained(self, keep_from: int, freed: int) -> None:
        """Retention dropped the records below `keep_from` (`freed` bytes), durably."""
        self.first_offset = max(self.first_offset, keep_from)
        self.size_bytes -= freed
        self.check()

    def evict_idle(self, now_ms: int, idle_ms: int) -> None:
        """Idle producers' windows leave memory (they stay persisted, read again if the
        producer comes back): a producer per Spark task would grow the node unbounded."""
        busy = {pid for pid, _ in self.in_flight}
        for pid in idle_producers(self.producers, now_ms / 1000, idle_ms / 1000, busy):
            del self.producers[pid]

    def forget_cut(self, window_ends: Iterable[tuple[str, int]], keep_from: int) -> list[str]:
        """Retention cuts the log below `keep_from`: the producers every batch of whose
        persisted window (`window_ends`) goes with it are forgotten; returns them, for the
        cut's write to drop their windows in the same batch."""
        busy = {pid for pid, _ in self.in_flight}
        forget = cut_producers(window_ends, keep_from, self.producers, busy)
        for pid in forget:
            self.producers.pop(pid, None)
        return forget

    def window(self, producer_id: str, now_ms: int) -> ProducerState:
        """A producer's window, read from the store the first time (least recent first)."""
        state = self.producers.get(producer_id)
        if state is None:
            raw = self._load_window(producer_id)
            state = ProducerState.decode(raw) if raw else ProducerState()
            self.producers[producer_id] = state
        else:
            self.producers.move_to_end(producer_id)
        state.last_used = now_ms / 1000
        return state

    def written(
        self,
        base: int,
        count: int,
        size: int,
        term: int,
        producer: tuple[str, int] | None,
        ledger: bool,
    ) -> Sequence[Effect]:
        """An append of `term` is durable (`size` bytes; group commit order: offsets in
        order); `ledger`: the ledger may mark it now (synced durability). The last
        record's term is the record's, not the pchannel's: a fence raises that before the
        writes in flight drain, and a stale log must not look newer than it is. Called
        once per record: a single replica's effects come as one small tuple."""
        if base != self.committed_next:
            raise InvariantBroken(
                f"{self.name}: write at {base}, durable end {self.committed_next}"
            )
        end = self.committed_next = base + count
        self.size_bytes += size
        self.last_term = term
        if producer is not None:
            self.in_flight.discard(producer)
        if ledger and end > self.ledger_mark:
            self.ledger_mark = end
        if self.role is None:
            self.check()
            return (MarkDurable(end), _NOTIFY) if ledger else _NOTIFY_ONLY
        out: list[Effect] = [MarkDurable(end)] if ledger else []
        out.extend(self.advance())
        out.append(_NOTIFY)
        self.check()
        return out

    def write_failed(self, producers: Iterable[tuple[str, int]]) -> list[Effect]:
        """A group commit failed: forget what never became durable (a resend is then
        appended for real) and hand out the lost offsets again.

        A leader's followers may hold those records already (they are streamed while the
        leader's fsync runs): the same offsets handed out again under this term would be
        two different records at one (term, offset), which no history tells apart. So a
        leader's role ends and the pchannel waits for an Assign, as after a restart: the
        coord moves it under a new term, whose history cuts the followers' extra records
        unless they are chosen to lead (none of them was acknowledged)."""
        for pid, seq in producers:
            self.in_flight.discard((pid, seq))
            state = self.producers.get(pid)
            if state is not None:
                state.forget(seq)
        self.next_offset = self.committed_next
        out: list[Effect] = [Notify()]
        if isinstance(self.role, Leading):
            self.recovering = True
            self.unled_term = self.term
            out = self._stop_role(
                ChannelFenced(f"pchannel {self.name!r}: a write failed, its leader role ended")
            )
        self.check()
        return out

    def durable(self, end: int) -> None:
        """The ledger marks the log durable up to `end` (async durability's periodic
        sync): damage found later is measured against it."""
        self.ledger_mark = max(self.ledger_mark, end)

    def idle(self, now_ms: int, interval_ms: int) -> bool:
        """Whether an idle time tick is due (serving, nothing appended for an interval,
        or the wall clock stepped back past the last append)."""
        since = now_ms - self.last_append_ms
        return self.meta.serving and (since >= interval_ms or since < 0)

    # ----------------------------------------------------------------- commit waiters

    def wait_commit(self, term: int, end: int, token: Any) -> list[Effect]:
        """Answer `token` once offsets below `end` are committed under `term`; fail it if
        this node does not lead `term` (or stops leading it first)."""
        role = self.role
        if not isinstance(role, Leading) or role.term != term:
            err = ChannelFenced(f"pchannel {self.name!r}: no longer the leader of term {term}")
            return [Fail((token,), err)]
        if (self.commit or 0) >= end:
            return [Answer((token,))]
        heapq.heappush(self._waiters, (end, next(self._order), token))
        return []

    def advance(self) -> list[Effect]:
        """Recompute a leader's commit offset (after a local sync or a follower's ack)."""
        role = self.role
        if not isinstance(role, Leading) or self.commit is None:
            return []
        acked = [role.acked.get(n, 0) for n in role.follower_ids(self.node_id)]
        new = rules.commit_offset(
            self.commit, self.committed_next, acked, max(1, len(role.members)), role.term_start
        )
        if new == self.commit:
            return []
        self.commit = new
        done = []
        while self._waiters and self._waiters[0][0] <= new:
            done.append(heapq.heappop(self._waiters)[2])
        return [Answer(tuple(done)), Notify()] if done else [Notify()]

    def _stop_role(self, error: StreamingError | None = None) -> list[Effect]:
        role, self.role = self.role, None
        if role is None:
            return []
        err = error or ChannelFenced(f"pchannel {self.name!r}: term {role.term} ended here")
        out: list[Effect] = []
        if self._waiters:
            out.append(Fail(tuple(t for _, _, t in sorted(self._waiters)), err))
            self._waiters = []
        if isinstance(role, Following):
            out.append(StopFollowing(role))
        out.append(Notify())
        return out

    # ----------------------------------------------------------------- roles

    def configure(self, rs: ReplicaSet | None) -> list[Effect]:
        """Take the role `rs` gives this node under the current term (or the single
        replica behaviour)."""
        if rs is None:
            self.commit = None
            self._high_commit = 0
            return self._stop_role()
        if self.commit is None:  # all that was acknowledged with one replica is committed
            self.commit = self._high_commit = self.committed_next
        members = list(rs.members)
        current = self.role
        if rs.leading and self.unled_term == self.term:
            raise ChannelFenced(
                f"pchannel {self.name!r}: a write failed while leading term {self.term}; "
                "it is led again only under a new term"
            )
        if rs.leading:
            if isinstance(current, Leading) and current.term == self.term:
                kept = {m.node_id for m in members}
                current.members = members
                current.acked = {n: a for n, a in current.acked.items() if n in kept}
                return self.advance()
            out = self._stop_role()
            start = next((f for t, f in reversed(self.meta.history) if t == self.term), None)
            term_start = self.next_offset if start is None else start
            self.role = Leading(self.term, members, term_start)
            out.extend(self.advance())
            out.append(AppendTick(self.term))
            return out
        assert rs.leader is not None
        if (
            isinstance(current, Following)
            and current.term == self.term
            and current.leader == rs.leader
        ):
            return []
        out = self._stop_role()
        ordinal = next(i for i, m in enumerate(members) if m.node_id == self.node_id)
        self.role = Following(self.term, rs.leader, ordinal)
        out.append(StartFollowing(self.role))
        return out

    # ----------------------------------------------------------------- management

    def assign(
        self,
        term: int,
        rs: ReplicaSet | None = None,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        retention: tuple[int, int] | None = None,
        accept_data_loss: bool = False,
    ) -> Steps:
        """Serve the pchannel under `term` (the meta persisted first); returns the
        AssignOutcome. With `catch_up_from` the records this node lacks are copied
        first; with `rs` the node leads or follows. A log that lacks acknowledged records
        is never led: a follower drops the damaged suffix and copies it again; a single
        replica is refused with DataLoss unless `accept_data_loss`, which starts the new
        term above every offset this node ever acknowledged."""
        following = rs is not None and not rs.leading
        outcome = decide_assign(self.fence if self.known else None, term)
        if self.known:
            if not following and self.unverified:
                yield from self._verify()
            cut = fencing.decide_damaged_assign(
                self.name, self.damage, self.needs_salvage, following, accept_data_loss, outcome
            )
            self.recovering = False
            if cut:
                yield from self._cut_damage(accept=not following)
        if outcome is not AssignOutcome.TAKE:
            yield from self.configure(rs)
            if retention is not None:
                self.meta = replace(
                    self.meta, retention_age_ms=retention[0], retention_bytes=retention[1]
                )
                yield PersistMeta(self.meta)
            self.check()
            return outcome
        self.taking = term
        yield from self._stop_role()
        if not self.drained:
            yield Drain()
        if catch_up_from:
            error = yield CatchUp(catch_up_from)
            if error is not None:
                raise error
        if self.next_offset < min_next_offset and not following:  # never reuse offsets
            self.next_offset = self.committed_next = min_next_offset
        # A follower's history follows the records it copies; a leader's term starts here.
        history = self.meta.history if following else [*self.meta.history, (term, self.next_offset)]
        meta = replace(self.meta, term=term, assigned_term=term, serving=True, history=history)
        if retention is not None:
            meta = replace(meta, retention_age_ms=retention[0], retention_bytes=retention[1])
        yield PersistMeta(meta)
        self.meta = meta
        self.taking = 0  # the role below is set in the same step: no gap to serve in
        self.known = True
        yield from self.configure(rs)
        yield Notify()  # consumers under the old term see the fence move
        self.check()
        return outcome

    def fence_term(self, term: int) -> Steps:
        """Raise the accepted term to `term` (persisted; any lower role ends) and return
        (last record's term, log end, commit offset, damage). A lower or equal term only
        reports; works whether or not the node serves or even holds the pchannel. A
        damaged log says so, with a commit offset covering what it acknowledged."""
        if term < 1:
            raise IgnoredOperation(f"term must be >= 1, got {term}")
        if term > self.meta.term:
            self.meta = replace(self.meta, term=term)
            yield from self._stop_role(
                ChannelFenced(f"pchannel {self.name!r} was fenced at term {term}")
            )
            yield PersistMeta(self.meta)
            self.known = True
            if not self.drained:
                yield Drain()
        if self.unverified:
            yield from self._verify()
        self.check()
        if self.damage:
            acked = max(self.known_commit, self.lost_until, self.ledger_mark)
            return self.last_term, self.committed_next, acked, self.damage
        return self.last_term, self.committed_next, self.known_commit, ""

    def remove(self, term: int) -> Steps:
        """Stop serving under `term` (a Remove): persisted once the writes drained."""
        decide_remove(self.fence if self.known else None, self.name, term)
        self.meta = replace(self.meta, serving=False)
        yield from self._stop_role()
        yield Notify()  # consumers see the fence move
        if not self.drained:
            yield Drain()
        yield PersistMeta(self.meta)
        self.check()

    # ----------------------------------------------------------------- damage

    def found_damage(self, offset: int, reason: str, store_corrupt: bool = False) -> list[Effect]:
        """A record at `offset` cannot be read back as written: nobody is served here from
        now on; a leader's role ends (the coord moves it). `store_corrupt`: the store
        itself failed a checksum, which no cut mends (salvage.py). Nothing when the damage
        was known already."""
        if self.bad_from is not None and self.bad_from <= offset:
            return []
        self.bad_from, self.bad_reason = offset, reason
        self.needs_salvage = self.needs_salvage or store_corrupt
        if isinstance(self.role, Leading):
            err = DataLoss(f"pchannel {self.name!r} lost acknowledged records: {self.damage}")
            return self._stop_role(err)
        return [Notify()]

    def rebuild(self) -> Steps:
        """A follower found its log damaged: drop the damaged suffix and follow again."""
        role = self.role
        if not isinstance(role, Following):
            return
        yield from self._stop_role()
        if not self.drained:
            yield Drain()
        yield from self._cut_damage(accept=False)
        if self.role is None and self.meta.term == role.term:
            self.role = role
            yield StartFollowing(role)

    def _verify(self) -> Steps:
        bad = yield Verify()
        self.unverified = False
        if bad is not None:
            yield from self.found_damage(*bad)

    def _cut_damage(self, accept: bool) -> Steps:
        """Drop the unreadable suffix; with `accept`, continue above every offset this node
        ever acknowledged (the new term's start, persisted by the assign)."""
        if self.bad_from is not None:
            yield from self.truncate(max(self.bad_from, self.first_offset), divergent=False)
            self.bad_from, self.bad_reason = None, ""
        if accept and self.committed_next < self.lost_until:
            self.next_offset = self.committed_next = self.lost_until

    # ----------------------------------------------------------------- copies

    def truncate(self, offset: int, divergent: bool = True) -> Steps:
        """Cut the log back to end at `offset` (a divergent or damaged suffix)."""
        if divergent:  # lowered first: a crash in between must not look like a loss
            self.ledger_mark = min(self.ledger_mark, offset)
        else:
            self.lost_until = max(self.lost_until, self.ledger_mark)
        dropped, last_term = yield Truncate(offset, divergent)
        self.meta = replace(self.meta, history=cut_history(self.meta.history, offset))
        yield PersistMeta(self.meta)
        self.next_offset = self.committed_next = offset
        if self.commit is not None and offset < self.commit:
            # The leader's log wins, but this drops records known committed: only an
            # unclean failover may do that (counted; the simulator treats it as a bug).
            self.unclean_cuts += 1
            self.commit = self._high_commit = offset
        self.size_bytes = max(0, self.size_bytes - dropped)
        self.producers.clear()
        self.last_term = last_term
        self.check()

    def store(self, got: Sequence[tuple[int, bytes]], commit: int | None = None) -> Steps:
        """Records copied from another node (catch-up, replication), in offset order:
        the state follows them and one synced write (`Store`) makes them durable; a
        failed write is undone by `unstore` (the step raises)."""
        before = (
            self.first_offset,
            self.next_offset,
            self.committed_next,
            self.size_bytes,
            self.last_term,
            self.meta.history,
            self.commit,
        )
        windows: dict[str, bytes] = {}
        for base, value in got:
            _, window = self.copy(base, value)
            if window is not None:
                windows[window[0]] = window[1]
        if commit is not None:
            self.commit = self._high_commit = max(
                self._high_commit, min(commit, self.committed_next)
            )
        staged = Staged(*before, end=self.committed_next)
        yield Store(tuple(got), self.meta, tuple(windows.items()), self.commit, staged)
        self.ledger_mark = max(self.ledger_mark, self.committed_next)
        yield MarkDurable(self.committed_next)  # before anyone is told
        self.check()

    def unstore(self, staged: Staged) -> None:
        """A write of copied records failed: the state goes back to what is durable, or
        the log end would claim records the disk lacks (and the next copy would leave a
        hole). Only the log goes back: a fence or an assign may have moved the term
        meanwhile, and terms never go back."""
        if self.committed_next != staged.end:
            return  # the log moved on (cut, copied again): nothing of this write is shown
        self.first_offset = staged.first_offset
        self.next_offset = staged.next_offset
        self.committed_next = staged.committed_next
        self.size_bytes = staged.size_bytes
        self.last_term = staged.last_term
        self.meta = replace(self.meta, history=staged.history)
        if self.commit is not None:
            self.commit = self._high_commit = min(self.commit, self.committed_next)
        self.producers.clear()  # read again from what the store holds
        self.check()

    def copy(
        self, base: int, value: bytes, where: str = ""
    ) -> tuple[int, tuple[str, bytes] | None]:
        """One copied record into the state (checksum verified; `where` names it in the
        error); returns its message count and the producer window to persist."""
        rec = records.decode(value, where or f"{self.name}@{base}")
        history = extend_history(self.meta.history, rec.term, base)
        if history is not None:
            self.meta = replace(self.meta, history=history)
        window = None
        if rec.producer is not None:
            pid, seq = rec.producer
            state = self.window(pid, self._now_ms)
            state.add(seq, BatchResult(base, rec.first_tick, rec.count))
            window = (pid, state.encode_upto(seq))
        if self.next_offset == 0 and not self.size_bytes:
            self.first_offset = base
        self.committed_next = self.next_offset = base + rec.count
        self.size_bytes += len(value)
        self.last_term = rec.term
        self.clock.observe(rec.last_tick)
        self.check()
        return rec.count, window

    # ----------------------------------------------------------------- replication

    def open_stream(
        self, follower: int, term: int, history: Sequence[tuple[int, int]], acked: int
    ) -> rules.Start:
        """A follower's first ReplicaAck: where to start streaming to it (and cut)."""
        role = self.role
        if not isinstance(role, Leading):
            raise ChannelFenced(f"pchannel {self.name!r} is not led by this node")
        if term != role.term:
            raise UnmatchedChannelTerm(
                f"replication of {self.name!r} under term {term} refused: the leader's "
                f"term is {role.term}"
            )
        if follower not in role.follower_ids(self.node_id):
            raise InvalidArgument(
                f"node {follower} is not a follower of {self.name!r} at term {role.term}"
            )
        start = rules.follower_start(history, acked, self.meta.history, self.committed_next)
        role.acked[follower] = start.position
        return start

    def acked(self, follower: int, term: int, end: int, sent: int) -> list[Effect]:
        """A follower holds (synced) everything below `end`; at most what was `sent`."""
        role = self.role
        if not isinstance(role, Leading) or role.term != term:
            return []
        role.acked[follower] = min(end, sent)
        out = self.advance()
        self.check()
        return out

    def apply(self, entries: Sequence[Entry]) -> Steps:
        """A follower applies its leader's entries: cut if told, store the records (one
        synced write), then learn the commit offset. Returns True when the log changed
        (acknowledge). Raises Rejected for an entry the follower must not apply."""
        role = self.role
        if not isinstance(role, Following):
            raise rules.Rejected(f"{self.name!r}: not a follower here")
        got: list[tuple[int, bytes]] = []
        commit = self.known_commit
        changed = False
        end = self.committed_next
        for e in entries:
            rules.check_entry(role.term, self.meta.term, e.term)  # every entry: cuts, commits
            if e.truncate_from is not None:
                rules.check_truncate(e.truncate_from, end)
                if got:
                    yield from self.store(got)
                    got = []
                yield from self.truncate(e.truncate_from)
                commit = min(commit, e.truncate_from)
                end = self.committed_next
                changed = True
            if e.record:
                rules.check_entry(role.term, self.meta.term, e.term, e.offset, end)
                got.append((e.offset, e.record))
                end = e.offset + records.peek(e.record)[2]
                changed = True
            commit = max(commit, e.commit_offset)
        if changed:
            yield from self.store(got, commit)
        else:
            self.commit = self._high_commit = max(self._high_commit, min(commit, end))
        yield Notify()
        self.check()
        return changed
