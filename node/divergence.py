"""Where a node's copy of a pchannel log stops agreeing with a newer owner's.

After an unclean failover the old owner may hold records the new owner never had. Term
histories (term -> first offset) tell where they part, as Kafka's leader epochs do
(KIP-101/KIP-279): the first term the source started after our last record's term marks
the offset from which our records are not in the source's log.
"""

from __future__ import annotations

from collections.abc import Sequence


def divergence_point(
    our_end: int, our_last_term: int, source_history: Sequence[tuple[int, int]]
) -> int | None:
    """The offset to cut our log back to before copying from the source, or None."""
    for term, first_offset in sorted(source_history):
        if term > our_last_term:
            return first_offset if first_offset < our_end else None
    return None
