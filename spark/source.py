"""The `streamwal` PySpark data source: batch and streaming reads, and the sink.

    spark.read.format("streamwal").option("coord", "host:port").option("pchannels", "p_0")

PySpark registers it by itself (the `pyspark_streamwal` module); docs/spark.md is the
user's guide.

The driver side (planning: which offsets, which partitions) lives here and in the pure
`offsets` module; tasks read with `reader.read_range` and write with `sink`.
A streaming offset is {pchannel: next offset}; nothing depends on `commit` being called
(Spark skips it for the last batch of an availableNow run): the checkpointed offsets
alone say where a restarted query resumes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from streamwal.errors import InvalidArgument
from streamwal.spark import discovery, offsets
from streamwal.spark.options import OffsetSpec, SourceOptions, parse_sink, parse_source
from streamwal.spark.reader import SCHEMA_DDL, RangePartition, read_range

try:  # 4.2+: lets availableNow runs stop at the offsets seen when they started
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

log = logging.getLogger("streamwal.spark.source")


class StreamwalDataSource(DataSource):
    """Reads pchannels as rows (see reader.SCHEMA_DDL); writes rows as messages."""

    @classmethod
    def name(cls) -> str:
        return "streamwal"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse_source(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(parse_source(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from streamwal.spark.sink import BatchWriter

        return BatchWriter(parse_sink(self.options, tuple(schema.fieldNames())))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from streamwal.spark.sink import StreamWriter

        return StreamWriter(parse_sink(self.options, tuple(schema.fieldNames())))


class _Partition(InputPartition):
    def __init__(self, part: RangePartition) -> None:
        super().__init__(part)
        self.part = part


def plan(
    opts: SourceOptions, start: Mapping[str, int], end: Mapping[str, int]
) -> list[InputPartition]:
    """Input partitions for [start, end): loss checked against the owners' retained
    bounds, big ranges split, each partition tagged with the owner seen now."""
    wanted = offsets.ranges(start, end)
    if not wanted:
        return []
    names = sorted({r.pchannel for r in wanted})
    owners, bounds = discovery.locate(opts.discovery, set(names).__contains__, names)
    checked = []
    for r in wanted:
        b = bounds[r.pchannel]
        begin = offsets.effective_start(r, b.first, b.next, opts.fail_on_data_loss)
        if begin != r.start:
            log.warning(
                "skipping offsets that are no longer retained",
                extra={"pchannel": r.pchannel, "from": r.start, "to": begin},
            )
        if begin < r.end:
            checked.append(offsets.Range(r.pchannel, begin, r.end, r.from_earliest))
    pieces = offsets.split(checked, opts.max_offsets_per_partition, opts.min_partitions)
    return [
        _Partition(RangePartition(p, owners[p.pchannel].address, owners[p.pchannel].term))
        for p in pieces
    ]


def resolve(
    opts: SourceOptions,
    spec: OffsetSpec,
    owners: Mapping[str, discovery.Owner],
    bounds: Mapping[str, offsets.Bounds],
    *,
    not_found_latest: bool,
) -> dict[str, int]:
    """Offsets of `spec` in every located pchannel; times are looked up on the owners."""
    millis = offsets.timestamps(spec, bounds)
    found = discovery.offsets_at_times(owners, bounds, millis, opts.discovery.timeout_s)
    return offsets.resolve(spec, bounds, found, not_found_latest=not_found_latest)


def _read(partition: InputPartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    # With no ranges to read Spark still runs one task, with a bare InputPartition(None).
    part = getattr(partition, "part", None)
    if part is not None:
        yield from read_range(part, opts)


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        owners, bounds = discovery.locate(opts.discovery, opts.selects, opts.required)
        start = resolve(
            opts, opts.starting, owners, bounds, not_found_latest=opts.time_not_found_latest
        )
        end = resolve(opts, opts.ending, owners, bounds, not_found_latest=True)
        for p, e in end.items():
            if e > bounds[p].next:
                raise InvalidArgument(
                    f"endingOffsets: pchannel {p} ends at {bounds[p].next}, {e} was asked"
                )
            if start[p] > e:
                raise InvalidArgument(
                    f"pchannel {p}: startingOffsets {start[p]} is after endingOffsets {e}"
                )
        return plan(opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.opts)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: dict[str, int] | None = None  # availableNow: where the run stops
        self._last_trigger: float | None = None  # monotonic time of the last new offsets

    def _locate(self, known: Mapping[str, int] = {}):
        required = set(self.opts.required) | set(known)
        return discovery.locate(self.opts.discovery, self.opts.selects, required)

    def _bounds(self, known: Mapping[str, int] = {}) -> dict[str, offsets.Bounds]:
        return self._locate(known)[1]

    def initialOffset(self) -> dict:
        owners, bounds = self._locate()
        return resolve(
            self.opts,
            self.opts.starting,
            owners,
            bounds,
            not_found_latest=self.opts.time_not_found_latest,
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: b.next for p, b in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit | None = None) -> dict:
        bounds = self._bounds(start)
        latest = {}
        for p, b in bounds.items():
            if p not in start:
                latest[p] = b.first  # a new pchannel: read from its earliest next batch
            elif start[p] > b.next:
                if self.opts.fail_on_data_loss:
                    raise offsets.DataLoss(
                        f"pchannel {p}: the checkpoint is at offset {start[p]} but the log ends "
                        f"at {b.next} (the pchannel was recreated or its log reset). Set "
                        f"failOnDataLoss=false to continue from its log end."
                    )
                log.warning("log reset under the checkpoint", extra={"pchannel": p})
                latest[p] = b.next
            else:
                latest[p] = b.next
        if self._target is not None:
            latest = offsets.cap(
                latest, {**self._target, **{p: start[p] for p in start if p not in self._target}}
            )
        now = time.monotonic()
        since = None if self._last_trigger is None else now - self._last_trigger
        if self._target is None and offsets.delay_trigger(
            start, latest, self.opts.min_offsets_per_trigger, since, self.opts.max_trigger_delay_s
        ):
            return start  # minOffsetsPerTrigger: not enough yet, and not waited long enough
        if isinstance(limit, ReadMaxRows):
            grow = {p: o for p, o in latest.items() if p in start and o >= start[p]}
            latest.update(offsets.rate_limit(start, grow, limit.max_rows))
        end = {**start, **latest}
        if end != start:
            self._last_trigger = now
        return end

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return plan(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.opts)

    def commit(self, end: dict) -> None:
        """Nothing to do: the node keeps no consumer state, the checkpoint is the truth."""
