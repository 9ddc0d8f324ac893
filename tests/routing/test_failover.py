"""A node killed with SIGKILL under a routed workload, and `streamwal dev` end to end.

While the killed owner is back within the coord's grace period its pchannels are assigned
again with catch-up (or on itself), and nothing acknowledged is lost, doubled or
reordered. When it is not back in time the failover is unclean and `streamwal dev` says
so and fails: the acknowledged messages on the dead node are stranded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from streamwal.testing.dev import DevConfig, run_dev

STREAMWAL = str(Path(sys.executable).parent / "streamwal")


async def test_kill_9_of_an_owner_that_restarts_loses_nothing(tmp_path) -> None:
    config = DevConfig(nodes=3, pchannels=4, messages=6000, restart_after=0.5, grace=10.0)
    summary = await run_dev(config, tmp_path / "dev", lambda _: None)
    print(
        "\nkill -9 + restart: "
        + ", ".join(
            f"{f['pchannel']} {f['old_node']}@{f['old_term']} -> "
            f"{f['new_node']}@{f['new_term']} in {f['recovered_s']}s"
            for f in summary["failovers"]
        )
        + f" (node back after {summary['restarted_after_s']}s)"
    )
    assert summary["failovers"], "the killed node owned no pchannel"
    assert summary["unclean_failovers"] == []
    assert summary["acknowledged"] == summary["sent"] == 6000
    assert summary["missing"] == summary["duplicates"] == summary["out_of_order"] == 0
    assert summary["moved_offset"] == 0
    for f in summary["failovers"]:
        assert f["new_term"] > f["old_term"]
    assert summary["ok"]


async def _dev(*args: str, timeout: float = 90) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        STREAMWAL, "dev", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            # SIGTERM first: `streamwal dev` then kills its nodes and coord; SIGKILL would
            # leave them running.
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
    return proc.returncode, out.decode(), err.decode()


async def test_streamwal_dev_runs_end_to_end_and_exits_0() -> None:
    code, out, err = await _dev("--messages", "3000")
    assert code == 0, out + err[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ok"] and summary["acknowledged"] == 3000 and summary["missing"] == 0
    assert "failover of node" in out and "OK: every acknowledged message" in out
    assert summary["total_s"] < 45


async def test_streamwal_dev_refuses_a_lasting_kill_of_single_copies_without_the_opt_in() -> None:
    code, _out, err = await _dev("--no-restart", timeout=30)
    assert code == 2 and "wait for it for ever" in err and "--allow-data-loss" in err, err


async def test_streamwal_dev_fails_honestly_on_an_unclean_failover() -> None:
    code, out, err = await _dev(
        "--messages", "3000", "--no-restart", "--allow-data-loss", "--grace", "1"
    )
    assert code == 1, out + err[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["unclean_failovers"], out
    assert summary["stranded_on_killed_node"] > 0, out
    assert "UNCLEAN failover" in out and "FAILED" in out, out
