"""The leader's disk fails under load: full (ENOSPC) or gone read-only (EROFS).

Every node's data dir is its own small file system: a tmpfs to fill, or an ext4 image on
a loop device mounted ``errors=remount-ro``, which a reported file system error turns
read-only while the node keeps its files open (`faults.Ext4Image`). Issue 22: a leader
whose WAL writes fail reports the pchannel unhealthy and the coord moves it; producers
write again within grace + 1 s; nothing acknowledged is lost; errors are logged with
counts, not once per request. After the fault: space comes back (the node should
recover by itself; the test notes whether it did, then restarts it if not), or the
read-only disk is repaired (node stopped, fsck, mounted again, node restarted).
"""

from __future__ import annotations

import pytest

from tests.nemesis.scenarios import GRACE, PROBE, LoadedCluster, assert_promise
from tests.support import wait_for

LOG_LINES_BOUND = 200  # the node's log lines over the fault and its healing
TRACEBACKS_BOUND = 3  # of them with a traceback (issue 22: 21,578 lines seen)


def log_since(path, offset: int) -> list[str]:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["full", "read-only"])
async def test_leader_disk_full_or_read_only(nemesis, fault: str) -> None:
    if fault == "full":
        disks = {i: nemesis.tmpfs(nemesis.root / f"node{i}", "64m") for i in (1, 2, 3)}
    else:
        disks = {i: nemesis.ext4(nemesis.root / f"node{i}", "96M") for i in (1, 2, 3)}
    load = LoadedCluster(nemesis.cluster(3, grace=GRACE, probe_interval=PROBE))
    notes: list[str] = []
    try:
        await load.start()
        leader = await load.leader()
        disk, node = disks[leader], load.cluster.nodes[leader]
        log_start = node.log_path.stat().st_size

        def inject() -> None:
            if fault == "full":
                notes.append(f"filled {disk.fill() >> 20} MiB")
            else:
                disk.read_only()

        async def heal() -> None:
            if fault == "full":
                disk.free()
                try:
                    await wait_for(lambda: load.cluster.caught_up(load.name), 10, 0.2)
                    notes.append("caught up by itself once space returned")
                    return
                except TimeoutError:
                    notes.append("not caught up 10s after space returned: restarted")
            node.kill()
            if fault == "read-only":
                disk.repair()
            await load.cluster.start_node(leader)

        outcome = await load.fault(
            f"disk {fault}", leader, inject, heal, hold=nemesis.rng.uniform(2.5, 4.0)
        )
        logged = log_since(node.log_path, log_start)
        tracebacks = [line for line in logged if '"exc"' in line or "Traceback" in line]
        outcome.notes += [*notes, f"{len(logged)} node log lines, {len(tracebacks)} tracebacks"]
        outcome = await load.finish(outcome)
        assert_promise(outcome)
        assert len(logged) < LOG_LINES_BOUND, f"the node logged {len(logged)} lines"
        assert len(tracebacks) <= TRACEBACKS_BOUND, (
            f"the node logged {len(tracebacks)} tracebacks, the first: {tracebacks[0][:1500]}"
        )
    finally:
        await load.close()
