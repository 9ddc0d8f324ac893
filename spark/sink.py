"""The `streamwal` sink: `df.write.format("streamwal")` and `df.writeStream.format(...)`.

Rows (payload binary; optional vchannel, pchannel, properties map, message_type) are
appended to the pchannel named by `pchannel`, else derived from `vchannel`, else the
`pchannel` option.

A retried task never duplicates what an earlier attempt appended: every task writes
through idempotent producers (the node's producer_id / batch sequence) whose ids are the
same for every attempt of the task — `spark:<write id>:<partition>` — and cuts each
pchannel's rows into batches deterministically (fixed row and byte bounds). A new attempt
learns from the node how many batches of that producer it already holds
(`last_sequence`) and skips them. For writeStream the write id is the query id plus the
micro-batch id, so a micro-batch replayed after a driver restart is skipped the same way;
for batch writes the option `idempotencyKey` makes a whole rerun idempotent (default: a
fresh id per write). This needs deterministic input per task (same rows, same order), as
any replay-based exactly-once does. See docs/decisions-spark.md.

Spark hands each task its rows as Arrow record batches (DataSourceArrowWriter); rows are
encoded and routed a column at a time (spark/entries.py), never as Python Row objects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from streamwal.client.node_client import NodeClient, Producer
from streamwal.spark import discovery, entries
from streamwal.spark.options import SinkOptions

log = logging.getLogger("streamwal.spark.sink")

BATCH_BYTES = 512 * 1024
MAX_PENDING_BATCHES = 16


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    appended: dict[str, int]  # pchannel -> messages appended by this attempt
    skipped: dict[str, int]  # pchannel -> messages an earlier attempt had appended


class _Target:
    """One pchannel of one task: its idempotent producer and the batch being filled."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.skip_batches = producer.last_sequence  # already on the node from earlier attempts
        self.batches = 0  # batches cut so far (the sequence of the next is batches + 1)
        self.open = entries.OpenBatch([])
        self.appended = 0
        self.skipped = 0


def _write(
    opts: SinkOptions,
    write_id: str,
    partition: int,
    batches: Iterator[pa.RecordBatch],
    loop: asyncio.AbstractEventLoop,
) -> SinkCommit:
    clients: dict[str, NodeClient] = {}
    targets: dict[str, _Target] = {}
    pending: list[concurrent.futures.Future] = []

    def call(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def open_target(pchannel: str) -> _Target:
        owner, _ = await asyncio.to_thread(discovery.owner_of, opts.discovery, pchannel)
        client = clients.get(owner.address) or clients.setdefault(
            owner.address, NodeClient(owner.address)
        )
        producer = await client.producer(
            pchannel, owner.term, producer_id=f"spark:{write_id}:{partition}"
        )
        return _Target(producer)

    def send(t: _Target, chunks: list, count: int) -> None:
        """Batch number t.batches + 1: skipped if an earlier attempt appended it."""
        t.batches += 1
        if t.batches <= t.skip_batches:
            t.skipped += count
            return
        t.appended += count
        # A run of entries is itself entries: MessageBatch bodies concatenate.
        sent = t.producer.send_batch(chunks)
        pending.append(asyncio.run_coroutine_threadsafe(sent, loop))
        while len(pending) > MAX_PENDING_BATCHES:
            pending.pop(0).result()

    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            encoded = entries.encode(batch)
            names, rows_of = entries.pchannels(batch, opts.pchannel)
            for i, pchannel in enumerate(names):
                t = targets.get(pchannel)
                if t is None:
                    t = targets[pchannel] = call(open_target(pchannel))
                mine = encoded if len(names) == 1 else encoded.take(np.flatnonzero(rows_of == i))
                for chunks, count in entries.cut(mine, t.open, opts.batch_rows, BATCH_BYTES):
                    send(t, chunks, count)
        for t in targets.values():
            if t.open.count:
                send(t, t.open.chunks, t.open.count)
        for f in pending:
            f.result()  # raises if a batch failed: the task fails, its retry resumes
        for t in targets.values():
            call(t.producer.close())
    finally:
        for f in pending:
            f.cancel()
        for c in clients.values():
            call(c.close())
    return SinkCommit(
        partition,
        {p: t.appended for p, t in targets.items()},
        {p: t.skipped for p, t in targets.items()},
    )


def _task_partition() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx else 0


def _log_commit(messages, what: str) -> None:
    appended = sum(sum(m.appended.values()) for m in messages if m is not None)
    skipped = sum(sum(m.skipped.values()) for m in messages if m is not None)
    log.info(f"{what} committed", extra={"appended": appended, "skipped_as_duplicates": skipped})


def run_write(opts: SinkOptions, write_id: str, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """Run `_write` on an event loop in its own thread, pulling rows in this one.

    Spark hands rows over a pipe; while this thread blocks on it, the loop thread keeps
    sending and acknowledging batches (on one thread, nothing would go out until the
    rows paused)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="streamwal-sink")
    thread.start()
    try:
        return _write(opts, write_id, _task_partition(), batches, loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.write_id = opts.idempotency_key or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return run_write(self.opts, self.write_id, iterator)

    def commit(self, messages: list[SinkCommit | None]) -> None:
        _log_commit(messages, "write")

    def abort(self, messages: list[SinkCommit | None]) -> None:
        """Appends cannot be taken back; a rerun with the same idempotencyKey completes
        the write without duplicating what is already there."""
        log.warning("write aborted", extra={"write_id": self.write_id})


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.fallback_id = opts.idempotency_key or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        write_id = f"{query}:{batch}" if query and batch else f"{self.fallback_id}:{uuid.uuid4()}"
        return run_write(self.opts, write_id, iterator)

    def commit(self, messages: list[SinkCommit | None], batchId: int) -> None:
        _log_commit(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[SinkCommit | None], batchId: int) -> None:
        log.warning("micro-batch write aborted", extra={"batch": batchId})
