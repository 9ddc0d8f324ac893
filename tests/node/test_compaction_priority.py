"""RocksDB's compactions run below the event loop's CPU priority unless told otherwise."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest


def _nice_by_thread(pid: int) -> dict[str, set[int]]:
    """Thread name -> the nice values of the threads with that name (from /proc); the
    main thread, which runs the event loop, as "main"."""
    out: dict[str, set[int]] = defaultdict(set)
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "stat").read_text()
        name = "main" if task.name == str(pid) else text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[name].add(int(fields[16]))  # field 19 of proc(5)'s stat: nice
    return out


def _after_a_compaction(start_node, priority: str) -> dict[str, set[int]]:
    # The new store's WAL pre-warm ends with a manual compaction, which runs on the
    # compaction pool and is waited for before the node serves; a pool thread takes its
    # priority when it starts a job.
    node = start_node(priority, "--wal-prewarm", "1MiB", "--compaction-priority", priority)
    return _nice_by_thread(node.proc.pid)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads Linux's /proc")
def test_compactions_yield_the_cpu_to_the_loop_by_default(start_node) -> None:
    threads = _after_a_compaction(start_node, "low")
    assert 19 in threads["rocksdb:low"]
    # Only compactions are lowered: the loop answering producers and RocksDB's flushes
    # (a late flush stalls writes) keep the node's own priority (this test's, inherited).
    own = os.nice(0)
    assert threads["main"] == {own}
    assert threads["rocksdb:high"] == {own}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads Linux's /proc")
def test_normal_priority_leaves_compactions_alone(start_node) -> None:
    threads = _after_a_compaction(start_node, "normal")
    assert threads["rocksdb:low"] == {os.nice(0)}
