"""CPU per append of the node's Wal, in-process: the cost the load of a shared machine
hardly moves (docs/benchmarks.md, "CPU per message").

A real Wal over a real LogStore, one pchannel; the group committer is bypassed (each
append's group is prepared and committed at once on this thread, its write batch never
written), so what is timed is the per-append path the node runs on its event loop:
access check, offsets and ticks, record encoding, the group's preparation and the commit's
bookkeeping (core inputs, effects, cache, metrics, the answer). Thread CPU time
(`time.thread_time`), the best of `--repeat` rounds, so other processes' load and
preemption drop out. Runs against any tree with the same Wal API (an A/B against an
older commit: that tree's python running this file by path).

Usage: python -m streamwal.bench.append_cpu [--appends N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

from streamwal.node.config import NodeConfig
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.wal import Wal
from streamwal.proto import streaming_pb2 as pb

BODY = pb.MessageBatch(messages=[pb.Message(payload=b"x" * 128)]).SerializeToString()


async def measure(appends: int, repeat: int) -> dict[str, float]:
    """µs of thread CPU per append: plain, and with an idempotent producer's window."""
    with tempfile.TemporaryDirectory(prefix="append-cpu-") as tmp:
        wal = Wal(LogStore(tmp), NodeConfig(node_id=1), NodeMetrics())
        wal.open()
        wal.start()
        try:
            await wal.assign("ch", 1)
            ch = wal.channels["ch"]
            await wal.append(ch, 1, BODY, 1)
            wb = wal.store.new_batch()

            def at_once(item) -> None:
                wal._prepare([item], wb)
                wal._committed([item])

            real = wal._committer.submit
            wal._committer.submit = at_once  # type: ignore[method-assign]
            out = {}
            seq = 0
            for label in ("plain", "producer"):
                best = float("inf")
                for _ in range(repeat):
                    started = time.thread_time()
                    for _ in range(appends):
                        seq += 1
                        producer = ("p", seq) if label == "producer" else None
                        wal.append(ch, 1, BODY, 1, producer=producer)
                    best = min(best, time.thread_time() - started)
                out[f"{label}_cpu_us_per_append"] = round(best / appends * 1e6, 2)
            wal._committer.submit = real  # type: ignore[method-assign]
            return out
        finally:
            await wal.close()
            wal.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="Appends per round.")
    parser.add_argument(
        "--repeat", type=int, default=25, help="Rounds; the fastest one is reported."
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.appends, args.repeat))))


if __name__ == "__main__":
    main()
