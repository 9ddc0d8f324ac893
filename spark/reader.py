"""The executor side of a read: one offset range of one pchannel into Arrow batches.

A range is read with a bounded consume (`end_offset`) straight from the owning node.
When the owner fails mid-read (the node dies, the pchannel is fenced or moves to a new
term) the reader asks discovery for the new owner and reopens at the last delivered
offset + 1 (offsets are MessageIDs, identical on every owner), so a failover neither
loses nor repeats a message of the range. Failovers are bounded by the discovery
timeout; a read that makes no progress for `read_timeout_s` counts as a failure too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamwal.client.consumed import ConsumedBatch, ConsumedMessage
from streamwal.client.policy import DeliverPolicy
from streamwal.client.sync import SyncNodeClient
from streamwal.errors import StreamingError, Unavailable
from streamwal.ids import decode_offset
from streamwal.proto import streaming_pb2 as pb
from streamwal.spark import discovery, frame_columns
from streamwal.spark.offsets import DataLoss, Range, effective_start
from streamwal.spark.options import SourceOptions

log = logging.getLogger("streamwal.spark.reader")

SCHEMA_DDL = (
    "pchannel string, vchannel string, offset long, term long, time_tick long, "
    "message_type int, properties map<string,string>, payload binary, timestamp timestamp"
)
ARROW_SCHEMA = pa.schema(
    [
        ("pchannel", pa.string()),
        ("vchannel", pa.string()),
        ("offset", pa.int64()),
        ("term", pa.int64()),
        ("time_tick", pa.int64()),
        ("message_type", pa.int32()),
        ("properties", frame_columns.PROPERTIES_TYPE),
        ("payload", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
PHYSICAL_SHIFT = 18  # a time tick is (physical ms << 18) | logical counter
ROWS_PER_BATCH = 32768  # the JVM's cost per Arrow batch is worth amortizing


@dataclass(frozen=True)
class RangePartition:
    """What a task needs (picklable): the range, and the owner the driver saw."""

    range: Range
    address: str
    term: int


def _numbers(frame: pb.ConsumeBatchResponse, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch frame's offsets and time ticks as columns (ConsumedBatch.offsets and
    time_ticks make a Python int per message)."""
    if frame.offsets:  # one per message (a filtered read)
        return np.array(frame.offsets, np.int64), np.array(frame.time_ticks, np.int64)
    first = decode_offset(frame.first_id.id)
    offsets = np.arange(first, first + n, dtype=np.int64)
    if not frame.tick_run_counts:
        return offsets, np.arange(n, dtype=np.int64) + frame.first_time_tick
    counts = np.array(frame.tick_run_counts, np.int64)
    starts = np.cumsum(counts) - counts  # each run's first message
    shift = np.array(frame.tick_run_first_ticks, np.int64) - starts
    return offsets, np.arange(n, dtype=np.int64) + np.repeat(shift, counts)


def _record_batch(
    pchannel: str,
    columns: frame_columns.FrameColumns,
    offsets: np.ndarray | list[int],
    ticks: np.ndarray | list[int],
    terms: np.ndarray | list[int],
) -> pa.RecordBatch:
    tick_column = pa.array(ticks, pa.int64())
    millis = pc.shift_right(tick_column, PHYSICAL_SHIFT)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(pchannel, pa.string()), len(tick_column)),
            columns.vchannel,
            pa.array(offsets, pa.int64()),
            pa.array(terms, pa.int64()),
            tick_column,
            columns.message_type,
            columns.properties,
            columns.payload,
            pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=ARROW_SCHEMA,
    )


def _frame_batch(pchannel: str, batch: Sequence[ConsumedMessage]) -> pa.RecordBatch:
    """One frame's rows through the protobuf objects: a frame in another layout, or a
    single-message frame."""
    if isinstance(batch, ConsumedBatch):
        columns = frame_columns.from_messages(batch.raw_messages)
        offsets, ticks = _numbers(batch.frame, len(batch))
        return _record_batch(pchannel, columns, offsets, ticks, [batch.term] * len(batch))
    columns = frame_columns.from_messages([m._msg for m in batch])  # the protobufs
    offsets, ticks = [m.offset for m in batch], [m.time_tick for m in batch]
    return _record_batch(pchannel, columns, offsets, ticks, [m.term for m in batch])


class Frames:
    """Consecutive frames of one pchannel, received and not yet made into rows (see
    SCHEMA_DDL). A batch frame is split into its message bodies on arrival (which counts
    them; its rows are not built from the protobuf objects); `rows` decodes the
    bodies of all of them at once (one set of numpy and Arrow calls), and takes the
    frames that the decoder does not read through the protobuf objects one by one."""

    def __init__(self, pchannel: str) -> None:
        self.pchannel = pchannel
        self.count = 0  # messages held
        # a batch frame with its bodies, or a single-message frame
        self._held: list[tuple[ConsumedBatch, pa.Array] | Sequence[ConsumedMessage]] = []

    def add(self, frame: Sequence[ConsumedMessage]) -> None:
        if isinstance(frame, ConsumedBatch):
            bodies = frame_columns.split(frame.serialized_messages)
            self._held.append((frame, bodies))
            self.count += len(bodies)
        else:
            self._held.append(frame)
            self.count += len(frame)

    def rows(self) -> pa.RecordBatch:
        """The rows of every frame held, in order; then it holds none."""
        held, self._held, self.count = self._held, [], 0
        split = [h for h in held if isinstance(h, tuple)]
        if len(split) == len(held) and (joined := self._decoded(split)) is not None:
            return joined
        parts = []
        for h in held:
            if not isinstance(h, tuple):
                parts.append(_frame_batch(self.pchannel, h))
            elif (one := self._decoded([h])) is None:
                parts.append(_frame_batch(self.pchannel, h[0]))
            else:
                parts.append(one)
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts, ARROW_SCHEMA).combine_chunks().to_batches()[0]

    def _decoded(self, split: list[tuple[ConsumedBatch, pa.Array]]) -> pa.RecordBatch | None:
        columns = frame_columns.decode(pa.concat_arrays([bodies for _, bodies in split]))
        if columns is None:  # one of them is not in the canonical layout
            return None
        counts = [len(bodies) for _, bodies in split]
        numbers = [_numbers(f.frame, len(bodies)) for f, bodies in split]
        offsets, ticks = (np.concatenate(column) for column in zip(*numbers, strict=True))
        terms = np.repeat(np.array([f.term for f, _ in split], np.int64), counts)
        return _record_batch(self.pchannel, columns, offsets, ticks, terms)


class _Failover(Exception):
    """The owner stopped serving the range; find the new one."""


def read_range(part: RangePartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Every message of `part.range` once, in offset order, as Arrow record batches."""
    r = part.range
    position = r.start  # next offset this read still owes
    address, term = part.address, part.term
    failover_deadline: float | None = None
    while position < r.end:
        try:
            for batch in _read_from(address, term, r, position, opts):
                if isinstance(batch, int):  # the start moved (truncation allowed)
                    position = batch
                    continue
                position = batch.column(2)[-1].as_py() + 1
                failover_deadline = None
                yield batch
            return  # the node closed the bounded read: everything below r.end delivered
        except DataLoss:
            raise
        except (StreamingError, TimeoutError, _Failover) as exc:
            now = time.monotonic()
            if failover_deadline is None:
                failover_deadline = now + opts.discovery.timeout_s
            if now > failover_deadline:
                raise Unavailable(
                    f"pchannel {r.pchannel}: reading offsets [{position}, {r.end}) failed and "
                    f"no owner served them within {opts.discovery.timeout_s:g}s: {exc}"
                ) from exc
            log.warning(
                "owner lost mid-read, rediscovering",
                extra={"pchannel": r.pchannel, "address": address, "term": term,
                       "position": position, "error": str(exc)},
            )  # fmt: skip
            time.sleep(0.2)
            try:
                owner, _ = discovery.owner_of(opts.discovery, r.pchannel)
            except Unavailable:
                continue
            address, term = owner.address, owner.term


def _read_from(
    address: str, term: int, r: Range, position: int, opts: SourceOptions
) -> Iterator[pa.RecordBatch | int]:
    client = SyncNodeClient(address)
    try:
        consumer = client.consumer(
            r.pchannel,
            term,
            DeliverPolicy.start_from(position),
            time_ticks=opts.include_time_ticks,
            end_offset=r.end,
            timeout=opts.read_timeout_s,
        )
        try:
            if consumer.next_offset < position:
                # This owner lacks offsets the range needs (it is not the right owner yet).
                raise _Failover(
                    f"owner {address} (term {term}) ends at {consumer.next_offset}, "
                    f"the range needs [{position}, {r.end})"
                )
            start = effective_start(
                Range(r.pchannel, position, r.end, r.from_earliest),
                consumer.first_offset,
                consumer.next_offset,
                opts.fail_on_data_loss,
            )
            if start != position:
                log.warning(
                    "skipping offsets removed by retention",
                    extra={"pchannel": r.pchannel, "from": position, "to": start},
                )
                yield start
            if start >= r.end:
                return
            pending = Frames(r.pchannel)
            try:
                while True:
                    batch = consumer.next_batch()
                    if batch is None:
                        break
                    pending.add(batch)
                    if pending.count >= ROWS_PER_BATCH:
                        yield pending.rows()
            except (StreamingError, TimeoutError):
                if pending.count:  # what arrived before the owner failed is delivered
                    yield pending.rows()
                raise
            if pending.count:
                yield pending.rows()
        finally:
            with contextlib.suppress(StreamingError, TimeoutError):
                consumer.close()
    finally:
        client.close()
