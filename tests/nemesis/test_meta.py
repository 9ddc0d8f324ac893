"""The coord's meta store loses a record: the file holding a pchannel's record (the live
journal) is deleted while the coord is down (a wrong `rm`, a restored backup, a file
system that lost a directory entry).

Corrupted records are refused with a clear error; a deleted record file once made its
pchannel vanish silently (issue 22, item 6). The promise: the coord detects the missing
file and reports it (refusing to start, or starting with an error that names it), never
serving on without a pchannel it once had.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from tests.nemesis.scenarios import GRACE, PROBE


def reported(log, since: int, name: str) -> list[str]:
    """Lines of the coord's log after byte `since` that report `name` (warnings, errors,
    or a start-up failure naming it)."""
    found = []
    with open(log, errors="replace") as f:
        f.seek(since)
        for line in f:
            if name not in line and "missing" not in line.lower():
                continue
            with contextlib.suppress(ValueError):
                if json.loads(line).get("level") not in ("warning", "error", "critical"):
                    continue
            found.append(line.strip()[:300])
    return found


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_deleted_meta_record_is_reported(nemesis) -> None:
    cluster = nemesis.cluster(3, grace=GRACE, probe_interval=PROBE)
    await cluster.start()
    names = await cluster.create_channels(3, prefix="meta", replicas=1)
    names += await cluster.create_channels(1, prefix="metar", replicas=3)
    await cluster.wait_healthy(names)
    victim = nemesis.rng.choice(names)
    cluster.kill_coord()
    (record,) = (nemesis.root / "meta").glob("journal.*")  # every record, the victim's too
    record.unlink()
    since = cluster.coord_log.stat().st_size

    refused = ""
    try:
        await cluster.start_coord()
    except (RuntimeError, TimeoutError) as exc:
        refused = str(exc)
    lines = reported(cluster.coord_log, since, record.name)
    known = [] if refused else list(await cluster.describe())
    print(
        f"deleted {record.name}: coord {'refused to start' if refused else 'serves'}; "
        f"describes {known}; report lines {lines[:3]}"
    )
    assert lines or victim in known, (
        f"the record of {victim} was deleted and the coord "
        f"{'exited without naming it' if refused else 'serves on silently without it'}: "
        f"it describes {known}"
    )
