"""Bit flips and truncation in RocksDB's files: the WAL (.log) and the tables (.sst).

The node is SIGKILLed after acknowledged writes and one of its files is damaged before it
restarts: 16 consecutive bytes get one bit flipped each in the middle of the file, or the
file loses its second half. For the .sst cases the stopped node's memtable is flushed
first (`faults.flush_offline`), so the acknowledged records sit in a table; for the .log
cases they sit in the newest WAL file. Issue 22's promises:

- One copy (RF=1): the node either refuses the pchannel with an error naming the
  corruption, or a consumer reads every acknowledged message; in no case is an offset
  acknowledged twice (new writes must not reuse the offsets of lost ones).
- A minority (RF=3, one follower damaged, then the leader killed): the damaged replica
  never leads; it is rebuilt; a reader from the start gets every acknowledged message
  without a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time

import pytest

from streamwal.client.wal import WAL, open_wal
from streamwal.errors import DataLoss, StreamingError
from streamwal.testing.history import Acked, acked_twice, payload
from streamwal.testing.replica_logs import read_replicas
from tests.nemesis import faults
from tests.nemesis.cluster import ASSIGNED
from tests.nemesis.history import Producers, lost, read_from_start
from tests.nemesis.scenarios import GRACE, PROBE, LoadedCluster
from tests.support import wait_for

REBUILD = 30.0  # seconds a damaged replica may take to be rebuilt, from its restart
NAMES_CORRUPTION = re.compile(r"corrupt|data.?loss|checksum", re.IGNORECASE)


def damage(data_dir, target: str, rng) -> str:
    """Damage one file of a stopped node's RocksDB; says what was done."""
    kind, how = target.split("-")
    suffix = ".log" if kind == "wal" else ".sst"
    if kind == "sst":
        faults.flush_offline(data_dir)
    files = [f for f in faults.rocksdb_files(data_dir, suffix) if f.stat().st_size > 0]
    assert files, f"no non-empty {suffix} file in {data_dir}"
    victim = files[-1]
    if how == "flip":
        where = faults.flip_bits(victim, rng)
        return f"flipped bits at {where[0]}..{where[-1]} of {victim.name}"
    size = victim.stat().st_size
    return f"truncated {victim.name} from {size} to {faults.truncate_file(victim)} bytes"


async def produce_after(wal: WAL, name: str, count: int = 20) -> tuple[list[Acked], str]:
    """Up to `count` new messages, each bounded: what was acknowledged, and the error."""
    acked: list[Acked] = []
    try:
        producer = await asyncio.wait_for(wal.producer(name, producer_id="after"), 15)
        try:
            for i in range(count):
                result = await asyncio.wait_for(producer.send(payload("after", i)), 10)
                acked.append(Acked("after", i, result.offset))
        finally:
            with contextlib.suppress(StreamingError, TimeoutError):
                await asyncio.wait_for(producer.close(), 5)
    except (StreamingError, TimeoutError) as exc:
        return acked, f"{type(exc).__name__}: {exc}"
    return acked, ""


async def settled(cluster, name: str) -> tuple[str, str] | None:
    """("data loss", why) once the coord shows the pchannel's loss, ("assigned", "") once
    it serves it, None before either."""
    d = (await cluster.describe()).get(name)
    if d is not None and d.data_loss:
        return "data loss", d.data_loss
    if d is not None and d.meta.state == ASSIGNED:
        return "assigned", ""
    return None


def accept_loss(cluster, name: str) -> str:
    """`streamwal channel accept-loss`, as an operator runs it; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "streamwal", "channel", "accept-loss", name,
         "--coord", cluster.coord_address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"accept-loss failed: {done.stderr}"
    return done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("target", ["wal-flip", "wal-truncate", "sst-flip", "sst-truncate"])
async def test_one_copy_corrupted(nemesis, target: str) -> None:
    """After the damage the pchannel is either served whole or refused (DATA_LOSS in
    `channel describe`, errors naming it); a refused one is accepted with `channel
    accept-loss` and must then serve again, its new offsets above every acknowledged one
    and a reader from the start not stalling. (A damaged table needs the node restarted,
    which salvages the store, before the loss can be accepted: the test does that when
    the first accept-loss fails.) A node that cannot start at all must say why in one
    line naming the corruption."""
    cluster = nemesis.cluster(1, grace=GRACE, probe_interval=PROBE)
    await cluster.start()
    (name,) = await cluster.create_channels(1, prefix="one", replicas=1)
    wal = await open_wal(cluster.coord_address, failover_timeout=10)
    try:
        await wal.resolve(name, timeout=30)
        work = Producers(wal, name).start()
        await work.wait_acks(nemesis.rng.randint(2000, 4000), timeout=60)
        cluster.kill_node(1)
        await work.stop(timeout=1.0)
        done = damage(cluster.data_dir(1), target, nemesis.rng)
        log_start = cluster.nodes[1].log_path.stat().st_size

        try:
            await cluster.start_node(1)
        except (RuntimeError, TimeoutError):
            with open(cluster.nodes[1].log_path, errors="replace") as f:
                f.seek(log_start)
                lines = f.read().splitlines()
            print(f"{target}: {done}; the node did not start; last line: {lines[-1][:500]}")
            assert NAMES_CORRUPTION.search(lines[-1]) and not any(
                "Traceback" in line or '"exc"' in line for line in lines
            ), f"the node did not start and did not say why in one line: {lines[-12:]}"
            return

        state, why = await wait_for(lambda: settled(cluster, name), 30, 0.2, "assigned or lost")
        errors = [f"describe: {why}"] if why else []
        read: list[tuple[int, bytes]] = []
        if state == "assigned":  # served again: then it must be whole
            try:
                read = await read_from_start(wal, name, timeout=10)
            except DataLoss as exc:  # found after describe looked: as a user, accept it
                errors.append(f"read: {type(exc).__name__}: {exc}")
                state = "data loss"
            except (StreamingError, TimeoutError, AssertionError) as exc:
                errors.append(f"read: {type(exc).__name__}: {exc}")
        gone = lost(work.acked, dict(read))
        accepted = ""
        if state == "data loss":
            try:
                accepted = accept_loss(cluster, name)
            except AssertionError as exc:  # a damaged table: "restart the node" first
                errors.append(f"first accept-loss: {exc}")
                cluster.kill_node(1)
                await cluster.start_node(1)
                for attempt in range(3):  # as an operator retries a refused command
                    await asyncio.sleep(2.0)
                    try:
                        accepted = accept_loss(cluster, name)
                        break
                    except AssertionError as again:
                        errors.append(f"accept-loss after the restart, try {attempt + 1}: {again}")
                assert accepted, f"the loss could not be accepted: {errors}"
            await cluster.wait_healthy([name])
        new, error = await produce_after(wal, name)
        if error:
            errors.append(f"produce: {error}")
        after: list[tuple[int, bytes]] = []
        try:
            after = await read_from_start(wal, name, timeout=10)
        except (StreamingError, TimeoutError, AssertionError) as exc:
            errors.append(f"read after: {type(exc).__name__}: {exc}")
        twice = acked_twice([*work.acked, *new])
        named = [e for e in errors if NAMES_CORRUPTION.search(e)]
        print(
            f"{target}: {done}; {state}; {len(work.acked)} acknowledged, {len(gone)} not read "
            f"back; accepted: {bool(accepted)}; {len(new)} new acks "
            f"(first at {new[0].offset if new else None}, last old ack "
            f"{max(a.offset for a in work.acked)}); {len(twice)} offsets acknowledged twice; "
            f"errors {errors}"
        )
        assert not twice, f"offsets acknowledged twice: {twice[:5]} ({len(twice)} in all)"
        assert not gone or named, (
            f"{len(gone)} of {len(work.acked)} acknowledged messages gone "
            f"(first {gone[0]}) and no error names the corruption: {errors}"
        )
        assert len(new) == 20 and not lost(new, dict(after)), (
            f"after {'accept-loss' if accepted else 'the restart'} the pchannel does not "
            f"serve: {len(new)} of 20 new messages acknowledged; {errors}"
        )
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(wal.close(), 10)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["wal-flip", "sst-flip"])
async def test_minority_corrupted_then_leader_killed(nemesis, target: str) -> None:
    """The damaged follower is the one today's tie-break elects (lowest node id among
    equal logs), and the producers are stopped before the leader dies so that both
    followers hold equal logs: only knowing about the damage keeps it from leading.
    It may lead once rebuilt, so "never leads" is checked by its effects: a reader from
    the start gets everything without a stall and every replica holds every ack."""
    load = LoadedCluster(nemesis.cluster(3, grace=GRACE, probe_interval=PROBE))
    try:
        await load.start()
        cluster, name = load.cluster, load.name
        await load.producers.wait_acks(nemesis.rng.randint(2000, 4000), timeout=60)
        leader = await load.leader()
        victim = min(n for n in (1, 2, 3) if n != leader)
        cluster.kill_node(victim)
        done = damage(cluster.data_dir(victim), target, nemesis.rng)
        corrupted_at = time.monotonic()
        await cluster.start_node(victim)
        await cluster.wait_healthy([name])
        await load.producers.wait_acks(200, timeout=30)
        await load.producers.stop()
        healthy = {n: cluster.nodes[n].address for n in (1, 2, 3) if n != victim}
        await asyncio.wait_for(read_replicas(healthy, name), 30)  # until their ends agree

        cluster.kill_node(leader)
        new_leader = await wait_for(
            lambda: _led_by_other(cluster, name, leader), 30, 0.1, "a new leader"
        )
        await asyncio.sleep(nemesis.rng.uniform(0.5, 2.0))
        await cluster.start_node(leader)
        after = Producers(load.wal, name, name="q").start()
        problems = []
        try:
            await after.wait_acks(200, timeout=15)
        except TimeoutError:
            problems.append(f"writes did not resume: {after.errors}")
        await after.stop()
        await load.reader.stop()
        acked = [*load.producers.acked, *after.acked]
        read: list[tuple[int, bytes]] = []
        try:
            await cluster.wait_healthy([name], timeout=60)
            read = await read_from_start(load.wal, name, timeout=15)
        except (AssertionError, StreamingError, TimeoutError) as exc:
            problems.append(f"the read from the start failed: {exc}")
        gone = lost(acked, dict(read))
        if gone:
            problems.append(f"{len(gone)} acknowledged messages not read (first {gone[0]})")
        deadline = time.monotonic() + REBUILD
        while True:  # the damaged replica refuses reads (DATA_LOSS) until it is rebuilt
            try:
                verdict = await cluster.check(name, acked, load.reader.seen)
                if not verdict.ok:
                    problems.append(f"replicas: {verdict.summary()[:3000]}")
                break
            except DataLoss as exc:
                if time.monotonic() > deadline:
                    problems.append(f"not rebuilt {REBUILD:.0f}s after the restart: {exc}")
                    break
                await asyncio.sleep(1.0)
            except (AssertionError, StreamingError) as exc:
                problems.append(f"replicas: {exc}")
                break
        twice = acked_twice(acked)
        if twice:
            problems.append(f"offsets acknowledged twice: {twice[:5]}")
        led = load.watch.led_by(victim, since=corrupted_at)
        if led and problems:  # leading is fine once rebuilt: the read and the replicas say
            problems.append(f"the corrupted replica {victim} led (pchannel, term) {led}")
        print(
            f"minority {target}: node {victim}: {done}; leader {leader} killed, node "
            f"{new_leader} led next; {len(acked)} acknowledged, {len(read)} read back; "
            f"{len(problems)} problems"
        )
        assert not problems, "\n".join(problems)
    finally:
        await load.close()


async def _led_by_other(cluster, name: str, old: int) -> int | None:
    leader = await cluster.leader(name)
    return leader if leader not in (None, old) else None
