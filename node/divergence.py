"""Where a node's copy of a pchannel log stops agreeing with a newer owner's.

After an unclean failover a node may hold records the leader never had. Term histories
(term -> first offset, in log order) tell where two logs part, as Kafka's leader epochs
do (KIP-101/KIP-279): two records at the same offset under the same term are the same
record (one leader per term, copies are verbatim), so the logs agree exactly up to the
first offset where the terms of their records differ.

A node's history follows its records: an owner adds (term, log end) when it takes a term,
and a copy adds (term, base) whenever a copied record's term differs from the last entry
(`extend_history`), after dropping entries that describe no record.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

History = Sequence[tuple[int, int]]  # (term, first offset), in log order


def term_at(history: History, offset: int) -> int:
    """The term of the record holding `offset` (0: the history says nothing there)."""
    starts = [first for _, first in history]
    i = bisect.bisect_right(starts, offset) - 1
    return history[i][0] if i >= 0 else 0


def log_divergence(ours: History, our_end: int, theirs: History, their_end: int) -> int | None:
    """The offset to cut our log back to before copying from theirs, or None.

    Offsets one history says nothing about (before its first entry: a log that started
    above 0) count as agreeing.
    """
    common_end = min(our_end, their_end)
    for start in sorted({0, *(f for _, f in ours), *(f for _, f in theirs)}):
        if start >= common_end:
            break
        a, b = term_at(ours, start), term_at(theirs, start)
        if a and b and a != b:
            return start
    return their_end if our_end > their_end else None


def extend_history(history: History, term: int, base: int) -> list[tuple[int, int]] | None:
    """The history after appending a record of `term` at `base`; None when unchanged."""
    if history and history[-1][0] == term and history[-1][1] <= base:
        return None
    kept = [(t, f) for t, f in history if f < base]  # entries at or past base hold no record
    if kept and kept[-1][0] == term:
        return kept
    return [*kept, (term, base)]


def cut_history(history: History, offset: int) -> list[tuple[int, int]]:
    """The history of a log cut back to end at `offset`."""
    return [(t, f) for t, f in history if f < offset]
