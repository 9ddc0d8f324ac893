"""gRPC adapter of consumer groups: StreamingNodeConsumerGroupService over the Wal.

Each pchannel's CursorTable (node/cursors.py) is loaded from the store's newest cursor
record on first use under a term, and reloaded when the term changes (a move, a
catch-up or a cut may have changed the log under it). A change moves the in-memory
cursor at once, on the event loop, so two concurrent consumes of one group never take
the same messages; the answer waits until the snapshot record carrying the change is
durable, through the normal append path (group commit), and, on a replicated pchannel,
committed on a quorum as a DEFAULT-level produce is.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from streamwal.errors import InvalidArgument, StreamingError
from streamwal.ids import decode_offset
from streamwal.node import delivery, records
from streamwal.node.channel import Channel
from streamwal.node.cursors import MAX_NAME_BYTES, Claim, CursorTable, take
from streamwal.node.service import Malformed, NodeService, _abort, _tolerant
from streamwal.node.wal import READ_BYTES, Wal
from streamwal.proto import groups_pb2 as gpb
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.node.groups")

READ_RECORDS = 1024
MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # a consume answers fewer than n rather than more


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
        log.info("consumer group destroyed", extra={"pchannel": ch.name, "group": req.group})
        return gpb.DestroyConsumerGroupResponse()

    async def consume(self, req: gpb.GroupConsumeRequest) -> gpb.GroupConsumeResponse:
        if req.max_messages < 1:
            raise InvalidArgument("max_messages must be >= 1")
        if len(req.consumer_id.encode()) > MAX_NAME_BYTES:
            raise InvalidArgument(f"consumer_id is longer than {MAX_NAME_BYTES} bytes")
        ch, term, table = self._access(req)
        start = table.get(ch.name, req.group)
        retry = table.claimed(req.group, req.consumer_id, req.claim)
        if retry is not None:  # the answer to this claim was lost: the same range again
            pieces, _ = self._take(ch, retry.start, req.max_messages, retry.end)
            return _response(pieces, table.cursors[req.group])
        pieces, cursor = self._take(ch, start, req.max_messages)
        if cursor == start:
            return gpb.GroupConsumeResponse(cursor=cursor)
        table.cursors[req.group] = cursor  # taken: a concurrent consume starts after it
        table.record_claim(req.group, req.consumer_id, Claim(req.claim, start, cursor))
        await self._persist(ch, term, table)
        return _response(pieces, cursor)

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
