"""Counts per message type of one vchannel's committed history (a batch job).

    spark-submit spark/jobs/message_type_counts.py --nodes 127.0.0.1:19530 --vchannel p_0_v1

Reads the vchannel's pchannel from earliest to the log end as of the start (only
committed messages are ever delivered), keeps the vchannel's rows and prints one line per
message type: code, Milvus name, count. `--json` prints a JSON object instead.
"""

from __future__ import annotations

import argparse
import json

from _session import discovery_args, discovery_options, session
from pyspark.sql import functions as F

from streamwal.message import MsgType, pchannel_of


def counts(spark, args: argparse.Namespace) -> dict[str, int]:
    pchannel = args.pchannel or pchannel_of(args.vchannel)
    df = (
        spark.read.format("streamwal")
        .options(**discovery_options(args))
        .option("pchannels", pchannel)
        .load()
        .where(F.col("vchannel") == args.vchannel)
        .groupBy("message_type")
        .count()
    )
    out = {}
    for row in df.collect():
        code = row.message_type
        name = MsgType(code).name if code in MsgType._value2member_map_ else str(code)
        out[name] = row["count"]
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    discovery_args(parser)
    parser.add_argument("--vchannel", required=True)
    parser.add_argument("--pchannel", help="default: derived from the vchannel name")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = counts(session("streamwal-message-type-counts"), args)
    if args.json:
        print(json.dumps(result))
    else:
        for name, n in result.items():
            print(f"{name}\t{n}")


if __name__ == "__main__":
    main()
