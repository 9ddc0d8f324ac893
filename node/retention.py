"""Retention: which oldest records of a pchannel to drop, by age and by size.

Pure: given the records' headers from the oldest on, it returns the first offset to keep.
Whole records are dropped (never a part of one), and the newest record is always kept so
a pchannel's end position survives even when everything is expired.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamwal.node.clock import physical_ms


def plan_cut(
    headers: Iterable[tuple[int, int, int, int]],
    *,
    now_ms: int,
    total_bytes: int,
    max_age_ms: int = 0,
    max_bytes: int = 0,
) -> tuple[int, int] | None:
    """(first offset to keep, bytes freed) or None when nothing is due.

    `headers` yields (base offset, first tick, count, value size) oldest first.
    """
    cut: int | None = None
    freed = 0
    previous: tuple[int, int, int, int] | None = None
    for header in headers:
        if previous is not None:
            _, first_tick, count, size = previous
            last_ms = physical_ms(first_tick + count - 1)
            too_old = max_age_ms > 0 and now_ms - last_ms > max_age_ms
            too_big = max_bytes > 0 and total_bytes - freed > max_bytes
            if not (too_old or too_big):
                break
            freed += size
            cut = header[0]
        previous = header
    return None if cut is None else (cut, freed)
