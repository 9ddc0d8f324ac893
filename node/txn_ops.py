"""Txn operations on a Produce stream: TxnRequest frames over the TxnTable and the Wal.

Begin, append and rollback only touch the node's memory and are answered at once. The
commit takes the buffer and appends it through the stream's normal append path (one
`Wal.append` call with FLAG_SHARED_TICK), so it is ordered with the stream's batches,
acknowledged under the same durability rule, and tied to the idempotent producer's
sequence: a resent commit is answered with the original result, never appended twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamwal.errors import InvalidArgument, StreamingError
from streamwal.ids import encode_offset
from streamwal.message import pchannel_of
from streamwal.node import records, validation
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.node.produce_stream import ProduceStream


def handle(stream: ProduceStream, req: pb.TxnRequest) -> None:
    """Answer one TxnRequest on `stream` (now, or once its commit is durable)."""
    rid = req.request_id

    def answer(**member) -> pb.ProduceResponse:
        return pb.ProduceResponse(txn=pb.TxnResponse(request_id=rid, **member))

    def fail(err: StreamingError) -> pb.ProduceResponse:
        return answer(error=err.to_proto())

    op = req.WhichOneof("op")
    now = time.monotonic()
    try:
        if op == "commit":
            _commit(stream, req.commit, answer, fail, now)
            return
        stream.ch.core.access(stream.term)
        if op == "begin":
            resp = _begin(stream, req.begin, answer, now)
        elif op == "append":
            resp = _append(stream, req.append, answer, now)
        elif op == "rollback":
            stream.svc.txns.rollback(stream, req.rollback.txn_id, now)
            resp = answer(rolled_back=pb.TxnRolledBack())
        else:
            raise InvalidArgument("empty TxnRequest")
    except StreamingError as err:
        stream.svc.count_limit(err)
        resp = fail(err)
    stream.outstanding += 1
    stream.answer(resp)


def _begin(stream: ProduceStream, req: pb.TxnBegin, answer, now: float) -> pb.ProduceResponse:
    ch = stream.ch
    if req.vchannel != ch.name and pchannel_of(req.vchannel) != ch.name:
        raise InvalidArgument(
            f"vchannel {req.vchannel!r} is not on pchannel {ch.name!r} "
            "(vchannels are named <pchannel>_<suffix>)"
        )
    validation.txn_begin(req, round(stream.svc.txns.limits.max_keepalive_s * 1000))
    keepalive = req.keepalive_ms / 1000 if req.keepalive_ms else None
    txn = stream.svc.txns.begin(stream, ch.name, stream.term, req.vchannel, keepalive, now)
    return answer(begun=pb.TxnBegun(txn_id=txn.txn_id, keepalive_ms=round(txn.keepalive_s * 1000)))


def _append(stream: ProduceStream, req: pb.TxnAppend, answer, now: float) -> pb.ProduceResponse:
    batch = validation.batch(req.messages, stream.svc.max_message_bytes)
    table = stream.svc.txns
    validation.reserved_properties(batch.messages, table.vchannel_of(stream, req.txn_id, now))
    txn = table.append(stream, req.txn_id, req.messages, len(batch.messages), now)
    return answer(appended=pb.TxnAppended(count=txn.count, bytes=txn.size))


def _commit(
    stream: ProduceStream,
    req: pb.TxnCommit,
    answer,
    fail: Callable[[StreamingError], pb.ProduceResponse],
    now: float,
) -> None:
    ch = stream.ch
    name = stream.producer_name
    producer = (name, req.sequence) if name and req.sequence else None

    def respond(count: int) -> Callable[[int, int, bool], pb.ProduceResponse]:
        def make(base: int, tick: int, duplicate: bool) -> pb.ProduceResponse:
            return answer(
                committed=pb.TxnCommitted(
                    first_id=pb.MessageID(id=encode_offset(base)),
                    count=count,
                    time_tick=tick,
                    duplicate=duplicate,
                )
            )

        return make

    try:
        txn = stream.svc.txns.take(stream, req.txn_id, ch.term, now)
    except StreamingError as err:
        if producer is not None and producer[1] <= stream.svc.wal.last_sequence(ch, name):
            # A resent commit that was appended: the Wal answers it from the producer's
            # window (or refuses it as too old) without appending anything.
            stream._submit(b"", 0, respond(0), fail, producer)
            return
        stream.outstanding += 1
        stream.answer(fail(err))
        return
    stream._submit(
        txn.body,
        txn.count,
        respond(txn.count),
        fail,
        producer,
        barrier_time_tick=req.barrier_time_tick,
        flags=records.FLAG_SHARED_TICK,
    )
