"""The `streamwal` PySpark data source: batch and streaming reads, and the sink.

    from streamwal.spark.source import StreamwalDataSource
    spark.dataSource.register(StreamwalDataSource)
    spark.read.format("streamwal").option("coord", "host:port").option("pchannels", "p_0")

The driver side (planning: which offsets, which partitions) lives here and in the pure
`offsets` module; tasks read with `reader.read_range` and write with `sink`.
A streaming offset is {pchannel: next offset}; nothing depends on `commit` being called
(Spark skips it for the last batch of an availableNow run): the checkpointed offsets
alone say where a restarted query resumes.
"""

from __future__ import annotations

import logging
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
from streamwal.spark.options import SourceOptions, parse_source
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
        from streamwal.spark.sink import BatchWriter, parse_sink

        return BatchWriter(parse_sink(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from streamwal.spark.sink import StreamWriter, parse_sink

        return StreamWriter(parse_sink(self.options, schema))


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
        _owners, bounds = discovery.locate(opts.discovery, opts.selects, opts.pchannels)
        start = offsets.resolve(opts.starting, bounds)
        end = offsets.resolve(opts.ending, bounds)
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

    def _bounds(self, known: Mapping[str, int] = {}) -> dict[str, offsets.Bounds]:
        required = set(self.opts.pchannels) | set(known)
        _, bounds = discovery.locate(self.opts.discovery, self.opts.selects, required)
        return bounds

    def initialOffset(self) -> dict:
        return offsets.resolve(self.opts.starting, self._bounds())

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
        if isinstance(limit, ReadMaxRows):
            grow = {p: o for p, o in latest.items() if p in start and o >= start[p]}
            latest.update(offsets.rate_limit(start, grow, limit.max_rows))
        return {**start, **latest}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return plan(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.opts)

    def commit(self, end: dict) -> None:
        """Nothing to do: the node keeps no consumer state, the checkpoint is the truth."""
