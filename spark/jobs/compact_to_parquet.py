"""WAL -> Parquet compaction: a Structured Streaming job, exactly once through its checkpoint.

    spark-submit spark/jobs/compact_to_parquet.py --nodes 127.0.0.1:19530 \
        --pchannel-pattern 'pchannel_.*' --output /data/wal --checkpoint /data/wal-ck

Parquet's file sink commits each micro-batch's files in its own log (`_spark_metadata`)
together with the checkpointed source offsets (MessageIDs per pchannel), so a run killed
at any point and started again writes no row twice and skips none: readers of the output
(Spark, or anything honouring `_spark_metadata`) see each message once. Output is
partitioned by pchannel; `--once` drains what is there now (availableNow) and stops.
"""

from __future__ import annotations

import argparse

from _session import discovery_args, discovery_options, session


def run(spark, args: argparse.Namespace):
    reader = spark.readStream.format("streamwal").options(**discovery_options(args))
    reader = reader.option("pchannelPattern", args.pchannel_pattern)
    reader = reader.option("startingOffsets", "earliest")
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    writer = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .partitionBy("pchannel")
    )
    writer = (
        writer.trigger(availableNow=True)
        if args.once
        else writer.trigger(processingTime=args.trigger)
    )
    return writer.start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    discovery_args(parser)
    parser.add_argument("--pchannel-pattern", default=".*")
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--trigger", default="10 seconds")
    parser.add_argument("--once", action="store_true", help="drain what is there, then stop")
    args = parser.parse_args(argv)
    run(session("streamwal-compact-to-parquet"), args).awaitTermination()


if __name__ == "__main__":
    main()
