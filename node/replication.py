"""Leader -> follower replication of a pchannel (the I/O around replication_rules.py).

A follower opens `Replicate` to its leader and sends ReplicaAcks (its log end; the first
one with its term history). The leader answers with LogEntries: its stored records
verbatim from where the two logs agree (`truncate_from` on the first entry when the
follower holds a suffix the leader does not), read from the tail cache or from RocksDB
in a worker thread, never more than WINDOW_BYTES ahead of the follower's acks, then the
new records as they are synced, and commit-offset updates. The follower writes what it
receives with the same code as a catch-up copy (Wal.apply_copied), syncs, and acks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import TYPE_CHECKING

import grpc

from streamwal.errors import (
    ChannelFenced,
    Inner,
    InvalidArgument,
    StreamingError,
    UnmatchedChannelTerm,
)
from streamwal.grpc_errors import from_rpc_error
from streamwal.logs import Repeats
from streamwal.node import records
from streamwal.node import replication_rules as rules
from streamwal.node.channel import Channel
from streamwal.node.health import quorum_contact
from streamwal.node.replica import FollowerRole, LeaderRole, Member, Progress, Role
from streamwal.proto import streaming_pb2 as pb
from streamwal.transport import make_internal_channel

if TYPE_CHECKING:
    from streamwal.node.wal import Wal

log = logging.getLogger("streamwal.node.replication")
_REPEATS = Repeats()  # a leader down: its followers retry every 2 s, logged every 10 s

REPLICATE = "/milvus.proto.streaming.StreamingNodeReplicationService/Replicate"
WINDOW_BYTES = 8 * 1024 * 1024  # record bytes sent to a follower and not yet acknowledged
READ_RECORDS = 1024  # records per read step of a follower's stream (also byte-bounded)
READ_BYTES = 1024 * 1024
APPLY_BYTES = 8 * 1024 * 1024  # a follower syncs and acks at least this often
BACKOFF = (0.05, 2.0)  # a follower's reconnect delay: first, maximum


def _history(starts) -> list[tuple[int, int]]:
    return [(t.term, t.first_offset) for t in starts]


def _starts(history) -> list[pb.TermStart]:
    return [pb.TermStart(term=t, first_offset=f) for t, f in history]


def parse_replica_set(rs: pb.ReplicaSet | None, node_id: int) -> tuple[int, list[Member]] | None:
    """(role, members) of an Assign, or None for the single-replica behaviour; raises on
    a replica set this node cannot act on (checked before anything is persisted)."""
    if rs is None or not rs.members:
        return None
    members = [Member(m.server_id, m.address) for m in rs.members]
    ids = [m.node_id for m in members]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"replica set names a node twice: {ids}")
    if node_id not in ids:
        raise InvalidArgument(f"replica set {ids} does not include this node ({node_id})")
    if rs.role == pb.REPLICA_ROLE_FOLLOWER:
        if not rs.leader.address or rs.leader.server_id == node_id:
            raise InvalidArgument("a follower's replica set needs its leader (another node)")
    elif rs.role != pb.REPLICA_ROLE_LEADER:
        raise InvalidArgument(f"unknown replica role {rs.role}")
    return rs.role, members


class Replication:
    """The replication roles of one node's pchannels, owned by its Wal."""

    def __init__(self, wal: Wal, node_id: int) -> None:
        self.wal = wal
        self.node_id = node_id
        self._saved_commit: dict[str, int] = {}

    # -- roles -------------------------------------------------------------------------

    def configure(self, ch: Channel, rs: pb.ReplicaSet | None) -> bool:
        """Take the role `rs` gives this node under the channel's current term (or the
        single-replica behaviour); returns True when a new leader role began."""
        parsed = parse_replica_set(rs, self.node_id)
        if parsed is None:
            self.stop_role(ch, None)
            ch.commit = None
            return False
        role_kind, members = parsed
        if ch.commit is None:  # all that was acknowledged with one replica is committed
            ch.commit = ch.committed_next
        current = ch.replica
        if role_kind == pb.REPLICA_ROLE_LEADER:
            if isinstance(current, LeaderRole) and current.term == ch.term:
                current.set_members(members)
                self.advance(ch)
                return False
            self.stop_role(ch, None)
            start = next((f for t, f in reversed(ch.meta.history) if t == ch.term), ch.next_offset)
            ch.replica = LeaderRole(ch.term, members, self.node_id, start, time.monotonic())
            self.advance(ch)
            self.publish(ch)
            return True
        assert rs is not None
        leader = Member(rs.leader.server_id, rs.leader.address)
        same = isinstance(current, FollowerRole) and current.term == ch.term
        if same and current.leader == leader:
            return False
        self.stop_role(ch, None)
        ordinal = next(i for i, m in enumerate(members) if m.node_id == self.node_id)
        self.follow_again(ch, FollowerRole(ch.term, leader, ordinal))
        return False

    def follow_again(self, ch: Channel, role: FollowerRole) -> None:
        """Follow the same leader under the same term with a new stream (a follower that
        dropped a damaged suffix copies it again)."""
        again = FollowerRole(role.term, role.leader, role.ordinal)
        ch.replica = again
        again.task = asyncio.get_running_loop().create_task(
            self._follow(ch, again), name=f"follow-{ch.name}"
        )
        self.publish(ch)

    def stop_role(self, ch: Channel, err: StreamingError | None) -> None:
        """End the channel's role (a higher term, a Remove, another role)."""
        role = ch.replica
        if role is None:
            return
        role.stop(err or ChannelFenced(f"pchannel {ch.name!r}: term {role.term} ended here"))
        ch.replica = None
        ch.notify()
        log.info("replica role ended", extra={"pchannel": ch.name, "term": role.term})

    async def settle(self, role: Role | None) -> None:
        """Wait for the last write of a stopped follower role (its task was cancelled, the
        write in the worker thread goes on): the state it already shows must be durable."""
        if isinstance(role, FollowerRole) and role.writing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(role.writing)

    def advance(self, ch: Channel) -> None:
        """Recompute a leader's commit offset (after a local sync or a follower's ack)."""
        role = ch.replica
        if not isinstance(role, LeaderRole) or role.stopped is not None or ch.commit is None:
            return
        new = role.next_commit(ch.commit, ch.committed_next)
        if new != ch.commit:
            ch.commit = new
            role.release(new)
            ch.notify()

    def wait_commit(self, ch: Channel, term: int, end: int) -> asyncio.Future:
        """Resolves once offsets below `end` are committed under `term`; fails if the
        channel's leader role for that term ended (fenced, removed)."""
        role = ch.replica
        if not isinstance(role, LeaderRole) or role.term != term:
            future = asyncio.get_running_loop().create_future()
            future.set_exception(
                ChannelFenced(f"pchannel {ch.name!r}: no longer the leader of term {term}")
            )
            return future
        return role.wait_commit(end, ch.commit or 0)

    def needs_quorum(self, ch: Channel, level: int) -> bool:
        role = ch.replica
        return isinstance(role, LeaderRole) and rules.quorum_ack(level, len(role.members))

    def persist_commit(self, ch: Channel, wb) -> None:
        """Lazily: the commit offset rides along with the next group commit."""
        if ch.commit is not None and self._saved_commit.get(ch.name) != ch.commit:
            self.wal.store.put_commit(wb, ch.name, ch.commit)
            self._saved_commit[ch.name] = ch.commit

    def publish(self, ch: Channel) -> None:
        m = self.wal.metrics
        role = ch.replica
        m.role.labels(ch.name, "leader").set(int(isinstance(role, LeaderRole)))
        m.role.labels(ch.name, "follower").set(int(isinstance(role, FollowerRole)))
        if isinstance(role, LeaderRole):
            for p in role.progress.values():
                m.replica_acked.labels(ch.name, str(p.node_id)).set(p.acked)
                m.replica_lag.labels(ch.name, str(p.node_id)).set(
                    max(0, ch.committed_next - p.acked)
                )

    def quorum_lost(self, ch: Channel) -> str:
        """Why `ch`'s leader role lacks a majority within its lease ("": it does not)."""
        role = ch.replica
        if not isinstance(role, LeaderRole) or role.stopped is not None:
            return ""
        lease = self.wal.config.quorum_lease_s
        now = time.monotonic()
        heard = [p.heard_at for p in role.progress.values()]
        if quorum_contact(heard, len(role.members), now, lease):
            return ""
        ages = ", ".join(
            f"node {p.node_id}: {now - p.heard_at:.1f}s ago" for p in role.progress.values()
        )
        return f"the leader heard from no majority of its replicas within {lease}s ({ages})"

    def status(self, ch: Channel, status: pb.PChannelStatus) -> None:
        role = ch.replica
        status.role = (
            pb.REPLICA_ROLE_FOLLOWER if isinstance(role, FollowerRole) else pb.REPLICA_ROLE_LEADER
        )
        status.last_term = ch.last_term
        status.commit_offset = ch.known_commit
        if isinstance(role, LeaderRole):
            for p in role.progress.values():
                status.replicas.append(
                    pb.ReplicaProgress(
                        node_id=p.node_id,
                        acked_offset=p.acked,
                        lag=max(0, ch.committed_next - p.acked),
                    )
                )

    # -- leader side -------------------------------------------------------------------

    def open_stream(self, first: pb.ReplicaAck) -> tuple[Channel, LeaderRole, Progress]:
        """Checks a follower's first ReplicaAck: this node leads the pchannel under the
        same term and the follower is a member."""
        ch = self.wal.channels.get(first.pchannel)
        role = ch.replica if ch is not None else None
        if ch is None or not isinstance(role, LeaderRole) or role.stopped is not None:
            raise ChannelFenced(f"pchannel {first.pchannel!r} is not led by this node")
        if first.term != role.term:
            raise term_error(first.pchannel, first.term, role.term)
        progress = role.progress.get(first.node_id)
        if progress is None:
            raise InvalidArgument(
                f"node {first.node_id} is not a follower of {first.pchannel!r} at term {role.term}"
            )
        return ch, role, progress

    async def serve(self, first: pb.ReplicaAck, acks, context) -> None:
        """One follower's Replicate stream: raises the StreamingError to abort it with."""
        ch, role, progress = self.open_stream(first)
        start = rules.follower_start(
            _history(first.term_history), first.acked_offset, ch.meta.history, ch.committed_next
        )
        log.info(
            "follower connected",
            extra={
                "pchannel": ch.name,
                "follower": first.node_id,
                "acked": first.acked_offset,
                "from": start.position,
                "truncate_from": start.truncate_from,
            },
        )
        progress.acked, progress.connected = start.position, True
        progress.heard_at = time.monotonic()
        try:
            await _LeaderStream(self, ch, role, progress, start, acks, context).run()
        finally:
            progress.connected = False

    # -- follower side -----------------------------------------------------------------

    async def _follow(self, ch: Channel, role: FollowerRole) -> None:
        """Stream from the leader while the role lasts, reconnecting with backoff."""
        delay = BACKOFF[0]
        while role.stopped is None:
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

    def _ack(self, ch: Channel, role: FollowerRole, first: bool = False) -> pb.ReplicaAck:
        return pb.ReplicaAck(
            pchannel=ch.name,
            term=role.term,
            node_id=self.node_id,
            replica=role.ordinal,
            acked_offset=ch.committed_next,
            term_history=_starts(ch.meta.history) if first else (),
        )

    async def _follow_once(self, ch: Channel, role: FollowerRole) -> None:
        try:  # the leader's internal listener, asked anew at every reconnect
            channel = await make_internal_channel(role.leader.address)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        try:
            call = channel.stream_stream(
                REPLICATE,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.LogEntry.FromString,
            )()
            queue: asyncio.Queue = asyncio.Queue(maxsize=1024)
            reader = asyncio.ensure_future(_pump(call, queue))
            try:
                await call.write(self._ack(ch, role, first=True))
                while role.stopped is None:
                    entries = [await queue.get()]
                    size = len(getattr(entries[0], "record", b""))
                    while not queue.empty() and size < APPLY_BYTES:
                        entries.append(queue.get_nowait())
                        size += len(getattr(entries[-1], "record", b""))
                    end = next((e for e in entries if isinstance(e, BaseException)), None)
                    applied = [e for e in entries if isinstance(e, pb.LogEntry)]
                    changed = bool(applied) and role.stopped is None
                    if changed and await self._apply(ch, role, applied):
                        await call.write(self._ack(ch, role))
                    if end is not None:
                        raise end
            finally:
                reader.cancel()
                call.cancel()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        except asyncio.InvalidStateError:  # the stream ended while we acknowledged
            raise Inner("the replication stream ended") from None
        finally:
            await channel.close()

    async def _apply(self, ch: Channel, role: FollowerRole, entries: list[pb.LogEntry]) -> bool:
        """Store entries (cutting first if told), sync, then learn the commit offset;
        True when the log changed (to acknowledge). A pure commit update is only kept in
        memory: it is saved with the next records."""
        wal, store = self.wal, self.wal.store
        wb = store.new_batch()
        commit = ch.known_commit
        changed = False
        for e in entries:
            rules.check_entry(role.term, ch.meta.term, e.term)  # every entry: cuts, commits
            if e.HasField("truncate_from"):
                rules.check_truncate(e.truncate_from, ch.committed_next)
                if e.truncate_from < ch.known_commit:
                    log.error(
                        "cutting below the commit offset (unclean failover)",
                        extra={"pchannel": ch.name, "from": e.truncate_from},
                    )
                await wal.truncate_suffix(ch, e.truncate_from)
                commit = min(commit, e.truncate_from)
                changed = True
            if e.record:
                rules.check_entry(role.term, ch.meta.term, e.term, e.offset, ch.committed_next)
                rec = records.decode(e.record, f"{ch.name}@{e.offset} from the leader")
                wal.apply_copied(ch, wb, e.offset, e.record, rec)
                changed = True
            commit = max(commit, e.commit_offset)
        ch.commit = min(commit, ch.committed_next)
        if not changed:
            return False
        store.put_size(wb, ch.name, ch.size_bytes)
        store.put_commit(wb, ch.name, ch.commit)
        write = wal.write_copied(ch, wb)
        role.writing = write  # a Fence waits for it: the log end it reports must be on disk
        await asyncio.shield(write)
        wal.mark_durable(ch)  # before the ack
        return True


def term_error(pchannel: str, theirs: int, ours: int) -> StreamingError:
    return UnmatchedChannelTerm(
        f"replication of {pchannel!r} under term {theirs} refused: the leader's term is {ours}"
    )


async def _pump(call, queue: asyncio.Queue) -> None:
    """LogEntries into `queue`, then the reason the stream ended (an exception)."""
    try:
        async for entry in call:
            await queue.put(entry)
        await queue.put(Inner("the leader closed the replication stream"))
    except grpc.RpcError as exc:
        await queue.put(from_rpc_error(exc))


class _LeaderStream:
    """The leader's half of one follower's Replicate stream."""

    def __init__(
        self,
        repl: Replication,
        ch: Channel,
        role: LeaderRole,
        progress: Progress,
        start: rules.Start,
        acks,
        context,
    ) -> None:
        self.repl = repl
        self.ch = ch
        self.role = role
        self.progress = progress
        self.start = start
        self.acks = acks
        self.context = context
        self.position = start.position
        self.window: collections.deque[tuple[int, int]] = collections.deque()
        self.inflight = 0
        self.acked = asyncio.Event()

    def _entry(self, **fields) -> pb.LogEntry:
        return pb.LogEntry(term=self.role.term, commit_offset=self.ch.known_commit, **fields)

    async def run(self) -> None:
        ch, role = self.ch, self.role
        reader = asyncio.ensure_future(self._read_acks())
        try:
            first = self._entry(offset=self.position, term_history=_starts(ch.meta.history))
            if self.start.truncate_from is not None:
                first.truncate_from = self.start.truncate_from
            await self.context.write(first)
            sent_commit = first.commit_offset
            while True:
                if role.stopped is not None or ch.replica is not role:
                    raise role.stopped or ChannelFenced(f"{ch.name!r}: leader role ended")
                if reader.done():
                    err = reader.result()
                    if err is not None:
                        raise err
                    return  # the follower closed its stream
                while self.window and self.window[0][0] <= self.progress.acked:
                    self.inflight -= self.window.popleft()[1]
                if self.position < ch.committed_next and self.inflight < WINDOW_BYTES:
                    await self._send_records()
                    sent_commit = ch.known_commit
                    continue
                if ch.known_commit != sent_commit:
                    sent_commit = ch.known_commit
                    await self.context.write(self._entry(offset=self.position))
                    continue
                self.acked.clear()
                waiter = asyncio.ensure_future(ch.wait_changed(1.0))
                acked = asyncio.ensure_future(self.acked.wait())
                await asyncio.wait((waiter, acked, reader), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                acked.cancel()
        finally:
            reader.cancel()

    async def _send_records(self) -> None:
        recs = await self.repl.wal.read_raw(self.ch, self.position, READ_RECORDS, READ_BYTES)
        for base, value in recs:
            if base < self.position:  # a record the follower already has (never split)
                continue
            entry = self._entry(offset=base, record=value)
            # Advanced before the write: the follower's ack of this record may be read
            # while the write is still awaited, and an ack above `position` is clipped.
            self.position = base + records.peek(value)[2]
            self.window.append((self.position, len(value)))
            self.inflight += len(value)
            await self.context.write(entry)

    async def _read_acks(self) -> StreamingError | None:
        """Follower acks until it closes (None) or misbehaves (the error)."""
        async for ack in self.acks:
            if not isinstance(ack, pb.ReplicaAck):
                return InvalidArgument(getattr(ack, "reason", "malformed ReplicaAck"))
            if ack.term != self.role.term or ack.node_id != self.progress.node_id:
                return term_error(self.ch.name, ack.term, self.role.term)
            if ack.replay:  # resend from what the follower holds
                self.position = min(self.position, ack.acked_offset)
                self.window.clear()
                self.inflight = 0
            self.progress.acked = min(ack.acked_offset, self.position)
            self.progress.heard_at = time.monotonic()
            self.repl.advance(self.ch)
            self.repl.publish(self.ch)
            self.acked.set()
        return None
