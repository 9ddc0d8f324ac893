"""What a node keeps of a pchannel besides its records, and where its log ends: plain data
shared by the store (log_store.py), the per-pchannel state (channel.py) and its pure core
(core.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class ChannelMeta:
    """What survives a restart of a pchannel besides its records.

    Frozen (changed only by `dataclasses.replace`), so its encoding is made once: a
    follower writes the meta with every batch it applies, nearly always unchanged."""

    term: int = 0
    serving: bool = False
    history: list[tuple[int, int]] = field(default_factory=list)  # (term, first offset)
    retention_age_ms: int = 0  # 0: keep forever
    retention_bytes: int = 0  # 0: no size limit
    # The term last assigned here; below `term` when a higher term was only fenced.
    assigned_term: int = 0

    def to_bytes(self) -> bytes:
        return self._encoded

    @cached_property
    def _encoded(self) -> bytes:
        return json.dumps(
            {
                "term": self.term,
                "assigned_term": self.assigned_term,
                "serving": self.serving,
                "history": self.history,
                "retention_age_ms": self.retention_age_ms,
                "retention_bytes": self.retention_bytes,
            }
        ).encode()

    @staticmethod
    def from_bytes(raw: bytes) -> ChannelMeta:
        d = json.loads(raw)
        return ChannelMeta(
            term=d["term"],
            serving=d["serving"],
            history=[tuple(h) for h in d["history"]],
            retention_age_ms=d.get("retention_age_ms", 0),
            retention_bytes=d.get("retention_bytes", 0),
            assigned_term=d.get("assigned_term", d["term"]),
        )


@dataclass(frozen=True)
class Tail:
    """Where a pchannel's log ends and begins, found by two seeks."""

    first_offset: int
    next_offset: int
    last_tick: int
    size_bytes: int
    last_term: int = 0  # term of the newest record
