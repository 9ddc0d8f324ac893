"""gRPC adapter of consumer groups: StreamingNodeConsumerGroupService over the Wal.

Each pchannel's CursorTable (node/cursors.py) is loaded from the store's newest cursor
record on first use under a term, and reloaded when the term changes (a move, a
catch-up or a cut may have changed the log under it). A change moves the in-memory
cursor at once, on the event loop, so two concurrent consumes of one group never take
the same messages; the answer waits until the snapshot record carrying the change is
durable, through the normal append path (group commit), and, on a replicated pchannel,
committed on a quorum as a DEFAULT-level produce is.

At-least-once consumes (node/cursors.py) leave their ranges pending on the consumer
until it commits; the session clock is this module's (`time.monotonic`), checked at
every call of the group, so a gone consumer's ranges are redelivered by the next consume
after its session ran out. The lag of each group (deliverable messages from its committed
offset to the end) is exported as `streamwal_group_lag_messages{group,pchannel}`,
refreshed by every consume, commit and describe of the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from streamwal.errors import InvalidArgument, StreamingError
from streamwal.ids import decode_offset
from streamwal.node import delivery, records
from streamwal.node.channel import Channel
from streamwal.node.cursors import DEFAULT_SESSION_S, MAX_NAME_BYTES, Claim, CursorTable, take
from streamwal.node.service import Malformed, NodeService, _abort, _tolerant
from streamwal.node.wal import READ_BYTES, Wal
from streamwal.proto import groups_pb2 as gpb
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.groups")

READ_RECORDS = 1024
MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # a consume answers fewer than n rather than more
LAG_SCAN_RECORDS = 4096  # a lag counted record by record; past this, offsets estimate it


class GroupService:
    def __init__(self, wal: Wal, node: NodeService) -> None:
        self.wal = wal
        self.node = node
        self._tables: dict[str, tuple[int, CursorTable]] = {}  # pchannel -> (term, table)

    def handler(self) -> grpc.GenericRpcHandler:
        def ser(msg) -> bytes:
            return msg.SerializeToString()

        def rpc(action, request_cls):
            async def call(request, context):
                try:
                    if isinstance(request, Malformed):
                        raise InvalidArgument(request.reason)
                    return await action(request)
                except StreamingError as err:
                    await _abort(context, err)

            return grpc.unary_unary_rpc_method_handler(call, _tolerant(request_cls), ser)

        return grpc.method_handlers_generic_handler(
            "streamwal.groups.StreamingNodeConsumerGroupService",
            {
                "CreateConsumerGroup": rpc(self.create, gpb.CreateConsumerGroupRequest),
                "DestroyConsumerGroup": rpc(self.destroy, gpb.DestroyConsumerGroupRequest),
                "GroupConsume": rpc(self.consume, gpb.GroupConsumeRequest),
                "GroupSeek": rpc(self.seek, gpb.GroupSeekRequest),
                "GroupCommit": rpc(self.commit, gpb.GroupCommitRequest),
                "DescribeConsumerGroups": rpc(self.describe, gpb.DescribeConsumerGroupsRequest),
            },
        )

    def start(self) -> None:
        self.wal.before_cut = self._keep_retained

    async def _keep_retained(self, ch: Channel, keep_from: int) -> None:
        """Append a pchannel's cursors again before retention cuts its newest cursor record:
        this node would keep them (the store's index holds the snapshot), but a node that
        catches up from this log copies only retained records, so the copy must come first.
        Only local durability is awaited, not a quorum: a stalled follower must not stall
        retention. A pchannel this node does not lead is cut anyway (its leader keeps the
        cursors)."""
        found = self.wal.store.load_cursors(ch.name)
        if found is None or found[0] >= keep_from:
            return
        try:
            self.wal.access(ch.name, ch.term)
            table = self._table(ch)
            await self.wal.append(ch, ch.term, table.encode(), 1, records.FLAG_CURSORS)
        except StreamingError as err:
            log.warning("cursor snapshot", extra={"pchannel": ch.name, "error": str(err)})

    def _access(self, req) -> tuple[Channel, int, CursorTable]:
        term = req.pchannel.term
        ch = self.wal.access(req.pchannel.name, term)
        return ch, term, self._table(ch)

    def _table(self, ch: Channel) -> CursorTable:
        cached = self._tables.get(ch.name)
        if cached is None or cached[0] != ch.term:
            cached = (ch.term, self._load(ch.name))
            self._tables[ch.name] = cached
        return cached[1]

    def _load(self, name: str) -> CursorTable:
        found = self.wal.store.load_cursors(name)
        if found is None:
            return CursorTable()
        base, value = found
        where = f"{name}@{base}"
        return CursorTable.decode(records.decode(value, where).body, where)

    async def _persist(self, ch: Channel, term: int, table: CursorTable) -> None:
        future = self.wal.append(ch, term, table.encode(), 1, records.FLAG_CURSORS)
        try:
            base, _ = await asyncio.shield(future)
            if self.wal.replication.needs_quorum(ch, pb.ACK_LEVEL_DEFAULT):
                await self.wal.replication.wait_commit(ch, term, base + 1)
        except BaseException:
            self._tables.pop(ch.name, None)  # reload what is durable at the next call
            raise

    async def create(self, req: gpb.CreateConsumerGroupRequest) -> gpb.CreateConsumerGroupResponse:
        ch, term, table = self._access(req)
        table.create(ch.name, req.group, ch.first_offset)
        await self._persist(ch, term, table)
        log.info("consumer group created", extra={"pchannel": ch.name, "group": req.group})
        return gpb.CreateConsumerGroupResponse(cursor=ch.first_offset)

    async def destroy(
        self, req: gpb.DestroyConsumerGroupRequest
    ) -> gpb.DestroyConsumerGroupResponse:
        ch, term, table = self._access(req)
        table.destroy(ch.name, req.group)
        await self._persist(ch, term, table)
        with contextlib.suppress(KeyError):
            self.wal.metrics.group_lag.remove(req.group, ch.name)
        log.info("consumer group destroyed", extra={"pchannel": ch.name, "group": req.group})
        return gpb.DestroyConsumerGroupResponse()

    async def consume(self, req: gpb.GroupConsumeRequest) -> gpb.GroupConsumeResponse:
        if req.max_messages < 1:
            raise InvalidArgument("max_messages must be >= 1")
        if len(req.consumer_id.encode()) > MAX_NAME_BYTES:
            raise InvalidArgument(f"consumer_id is longer than {MAX_NAME_BYTES} bytes")
        if req.at_least_once and not req.consumer_id:
            raise InvalidArgument("an at-least-once consume names its consumer_id")
        ch, term, table = self._access(req)
        group, consumer = req.group, req.consumer_id
        start = table.get(ch.name, group)
        now = time.monotonic()
        self._expire(ch, table, group, now)
        if req.at_least_once:
            table.touch(group, consumer, now, _session(req.session_timeout_ms))
        retry = table.claimed(group, consumer, req.claim)
        if retry is not None:  # the answer to this claim was lost: the same range again
            pieces, _ = self._take(ch, retry.start, req.max_messages, retry.end)
            return _response(pieces, table.cursors[group])
        if req.at_least_once:
            table.check_room(ch.name, group, consumer)
            orphan = table.next_orphan(group)
            if orphan is not None:
                return await self._redeliver(ch, term, table, req, orphan)
        pieces, cursor = self._take(ch, start, req.max_messages)
        if cursor == start:
            return gpb.GroupConsumeResponse(cursor=cursor)
        table.cursors[group] = cursor  # taken: a concurrent consume starts after it
        table.record_claim(group, consumer, Claim(req.claim, start, cursor))
        if req.at_least_once and pieces:
            table.hold(group, consumer, (start, _after_last(pieces)))
        if pieces:
            await self._persist(ch, term, table)
        # else: only time ticks and internal records were passed over. Forgetting that
        # move (a restart, a failover) loses nothing; persisting it appended a cursor
        # record, itself passed over by the next poll: an idle member wrote one per poll.
        self._export_lag(ch, table, group)
        self.wal.metrics.delivered(ch.name)[0] += sum(p.count for _, p in pieces)
        return _response(pieces, cursor)

    async def _redeliver(
        self, ch: Channel, term: int, table: CursorTable, req, orphan: tuple[int, int]
    ) -> gpb.GroupConsumeResponse:
        """Hand out (the first part of) a gone consumer's uncommitted range."""
        group, consumer = req.group, req.consumer_id
        pieces, after = self._take(ch, orphan[0], req.max_messages, orphan[1])
        after = max(after, orphan[0] + 1) if not pieces else after
        table.settle_orphan(group, (orphan[0], after))
        table.record_claim(group, consumer, Claim(req.claim, orphan[0], after))
        if pieces:
            table.hold(group, consumer, (orphan[0], _after_last(pieces)))
        await self._persist(ch, term, table)
        count = sum(p.count for _, p in pieces)
        self.wal.metrics.group_redelivered.labels(group=group, pchannel=ch.name).inc(count)
        self.wal.metrics.delivered(ch.name)[0] += count
        response = _response(pieces, table.cursors[group])
        response.redelivered = bool(pieces)
        return response

    def _expire(self, ch: Channel, table: CursorTable, group: str, now: float) -> None:
        for consumer in table.expire(group, now):
            log.info(
                "group consumer gone: its uncommitted messages are redelivered",
                extra={"pchannel": ch.name, "group": group, "consumer": consumer},
            )

    async def commit(self, req: gpb.GroupCommitRequest) -> gpb.GroupCommitResponse:
        if not req.consumer_id:
            raise InvalidArgument("a commit names its consumer_id")
        ch, term, table = self._access(req)
        group, consumer = req.group, req.consumer_id
        table.get(ch.name, group)
        now = time.monotonic()
        self._expire(ch, table, group, now)
        settled = table.commit(group, consumer, req.offset) if req.HasField("offset") else 0
        if req.leave:
            table.orphan(group, consumer)
        else:
            table.touch(group, consumer, now, _session(req.session_timeout_ms))
        if settled or req.leave:
            await self._persist(ch, term, table)
        self._export_lag(ch, table, group)
        return gpb.GroupCommitResponse(committed=table.committed(group))

    async def describe(
        self, req: gpb.DescribeConsumerGroupsRequest
    ) -> gpb.DescribeConsumerGroupsResponse:
        ch, _term, table = self._access(req)
        names = list(req.groups) or sorted(table.cursors)
        for name in names:
            table.get(ch.name, name)
        now = time.monotonic()
        out = gpb.DescribeConsumerGroupsResponse()
        for name in names:
            self._expire(ch, table, name, now)
            description = out.groups.add(
                group=name,
                cursor=table.cursors[name],
                committed=table.committed(name),
                end_offset=ch.visible_next,
                lag=self._export_lag(ch, table, name),
                orphaned_ranges=len(table.orphans(name)),
            )
            for consumer, ranges in sorted(table.members(name).items()):
                seen = table.seen.get((name, consumer))
                description.members.add(
                    consumer_id=consumer,
                    pending_ranges=len(ranges),
                    pending_offsets=sum(end - start for start, end in ranges),
                    idle_seconds=round(now - seen[0], 3) if seen else 0.0,
                )
        return out

    def _export_lag(self, ch: Channel, table: CursorTable, group: str) -> int:
        """Deliverable messages (no ticks, no internal records) from the group's committed
        offset to the visible end, exported as the group's lag; counted record by record
        for LAG_SCAN_RECORDS records, estimated from offsets past them."""
        at = max(table.committed(group), ch.first_offset)
        end = ch.visible_next
        lag = scanned = 0
        while at < end and scanned < LAG_SCAN_RECORDS:
            recs = self.wal.read(ch, at, min(READ_RECORDS, LAG_SCAN_RECORDS - scanned))
            if not recs:
                break
            for base, value in recs:
                count = records.peek(value)[2]
                flags = records.peek_flags(value)
                if not flags & (records.INTERNAL_FLAGS | records.FLAG_TIME_TICK):
                    lag += base + count - max(base, at)
                at = base + count
            scanned += len(recs)
        lag += max(0, end - at)
        self.wal.metrics.group_lag.labels(group=group, pchannel=ch.name).set(lag)
        return lag

    def _take(
        self, ch: Channel, start: int, n: int, end: int | None = None
    ) -> tuple[list[tuple[int, delivery.Slice]], int]:
        """Up to `n` messages from `start` (and below `end`): (term, slice) pieces and
        where the cursor goes after them."""
        cursor, taken, size = start, 0, 0
        pieces: list[tuple[int, delivery.Slice]] = []
        while taken < n and size < MAX_RESPONSE_BYTES and (end is None or cursor < end):
            recs = self.wal.read(ch, max(cursor, ch.first_offset), READ_RECORDS, READ_BYTES)
            if end is not None:
                recs = [(b, v) for b, v in recs if b < end]
            decoded = [(b, records.decode(v, f"{ch.name}@{b}")) for b, v in recs]
            got, after, taken = take(decoded, cursor, n, taken)
            if after == cursor:
                break
            pieces += got
            size += sum(len(p.body) for _, p in got)
            cursor = after
        return pieces, cursor

    async def seek(self, req: gpb.GroupSeekRequest) -> gpb.GroupSeekResponse:
        ch, term, table = self._access(req)
        table.get(ch.name, req.group)
        try:
            offset = decode_offset(req.message_id.id)
        except ValueError as exc:
            raise InvalidArgument(f"bad MessageID: {exc}") from None
        if offset > ch.visible_next:
            raise InvalidArgument(
                f"offset {offset} is past the end of pchannel {ch.name!r} ({ch.visible_next})"
            )
        for base, value in self.wal.read(ch, offset, 1):
            count = records.peek(value)[2]
            shared = records.peek_flags(value) & records.FLAG_SHARED_TICK
            if shared and base < offset < base + count:
                raise InvalidArgument(
                    f"offset {offset} is inside a transaction at [{base}, {base + count}): "
                    "seek to its first offset or past it"
                )
        table.cursors[req.group] = offset
        await self._persist(ch, term, table)
        return gpb.GroupSeekResponse()


def _after_last(pieces: list[tuple[int, delivery.Slice]]) -> int:
    """The offset after the last message handed out: a pending range ends there, not
    at the cursor (which may have moved on over ticks the consumer never sees, and a
    commit of its last message must settle the range)."""
    last = pieces[-1][1]
    return (last.offsets[-1] if last.offsets else last.first_offset + last.count - 1) + 1


def _session(ms: int) -> float:
    return ms / 1000 if ms else DEFAULT_SESSION_S


def _response(pieces: list[tuple[int, delivery.Slice]], cursor: int) -> gpb.GroupConsumeResponse:
    resp = gpb.GroupConsumeResponse(cursor=cursor)
    for term_of, run in _by_term(pieces):
        resp.batches.append(delivery.batch_frame(delivery.join(run), term_of).consume_batch)
    return resp


def _by_term(pieces: list[tuple[int, delivery.Slice]]) -> list[tuple[int, list[delivery.Slice]]]:
    runs: list[tuple[int, list[delivery.Slice]]] = []
    for term, piece in pieces:
        if runs and runs[-1][0] == term:
            runs[-1][1].append(piece)
        else:
            runs.append((term, [piece]))
    return runs
