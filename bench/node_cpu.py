"""CPU per message of `streamwal bench node`'s phases, in the node process and in the
client: what the load of a shared machine moves much less than the rates
(docs/benchmarks.md, "CPU per message").

One node process and this process as its client run bench node's workloads after the
same warm-up: one-at-a-time sends, the pipelined produce run (bench node's frames, 8 in
flight) and the catch-up read of that run. For each phase, divided by the messages: CPU
time on all the node's threads (/proc/PID/task/*/schedstat, nanoseconds; Linux only), on
its event-loop thread alone, of this process (`time.process_time`) and of its event-loop
thread; and the wall-clock rate, for reference only. Runs against any tree with the same
bench.node and LocalNode (an A/B against an older commit: that tree's python running
this file by path). The last stdout line is one JSON object.

Usage: python -m streamwal.bench.node_cpu [--messages N] [--sends N] [--size BYTES]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import uvloop

from streamwal.bench.node import (
    PCHANNEL,
    consume_all,
    fill,
    frame_messages,
    one_at_a_time,
    warm_up,
)
from streamwal.client.node_client import NodeClient
from streamwal.testing.local_node import LocalNode


def node_cpu(pid: int) -> tuple[float, float]:
    """(all threads, the main thread) seconds on a CPU so far; a thread that ended is
    no longer counted (the node's worker threads live as long as the node)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        main = int(f.read().split()[0])
    return total / 1e9, main / 1e9


class Phase:
    """CPU and wall time spent between `__enter__` and `done(messages)`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Phase:
        self.node = node_cpu(self.pid)
        self.client = time.process_time()
        self.client_loop = time.thread_time()
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        node = node_cpu(self.pid)
        self.node_s = node[0] - self.node[0]
        self.loop_s = node[1] - self.node[1]
        # The thread's clock is read inside the process's at both ends, so the loop
        # thread's share never exceeds the process's (a run of 8,192 messages showed
        # 923.29 against 923.10 ns with the end readings the other way round).
        self.client_loop_s = time.thread_time() - self.client_loop
        self.client_s = time.process_time() - self.client
        self.wall_s = time.perf_counter() - self.wall

    def per_message(self, messages: int, unit: float) -> dict[str, float]:
        return {
            "node": round(self.node_s / messages * unit, 2),
            "node_loop": round(self.loop_s / messages * unit, 2),
            "client": round(self.client_s / messages * unit, 2),
            "client_loop": round(self.client_loop_s / messages * unit, 2),
            "msgs_per_s": round(messages / self.wall_s),
        }


async def measure(messages: int, sends: int, size: int = 128) -> dict:
    with tempfile.TemporaryDirectory(prefix="node-cpu-") as tmp:
        node = LocalNode(Path(tmp) / "node", node_id=1, extra_args=("--log-level", "warning"))
        node.start()
        pid = node.proc.pid
        out = {}
        try:
            async with NodeClient(node.address) as nc:
                await nc.assign(PCHANNEL, 1)
                producer = await nc.producer(PCHANNEL, 1)
                await warm_up(producer, size)  # bench node's
                with Phase(pid) as one:
                    await one_at_a_time(producer, size, sends, "one at a time")
                out["one_at_a_time_us_per_send"] = one.per_message(sends, 1e6)
                start = (await nc.collect_status()).channels[0].next_offset
                with Phase(pid) as produce:
                    await fill(producer, messages, size, frame_messages(size), 8)
                out["produce_ns_per_msg"] = produce.per_message(messages, 1e9)
                end = (await nc.collect_status()).channels[0].next_offset
                with Phase(pid) as consume:
                    count, _ = await consume_all(nc, 1, start, end)
                out["consume_ns_per_msg"] = consume.per_message(count, 1e9)
                await producer.close()
        finally:
            node.kill()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages",
        type=int,
        default=600_000,
        help="Messages of the pipelined produce run (and of the catch-up read of it).",
    )
    parser.add_argument(
        "--sends", type=int, default=2000, help="One-at-a-time sends (their CPU per send)."
    )  # fmt: skip
    parser.add_argument("--size", type=int, default=128, help="Payload bytes (default 128).")
    args = parser.parse_args()
    if args.size < 1:
        parser.error("--size must be at least 1")
    print(json.dumps(uvloop.run(measure(args.messages, args.sends, args.size))))


if __name__ == "__main__":
    main()
