"""Replication decisions, pure: the commit rule, ack levels, where a follower starts, and
what a follower accepts.

The leader streams its records verbatim to the followers as they go to its disk (its own
fsync overlaps theirs); the followers store, sync and acknowledge their log end. The
commit offset (consumers see only offsets below it; QUORUM producers are answered once it
passes their batch) is the highest offset stored on a majority of the members, leader
included, and never past the leader's own durable end (what it serves stops there). As
in Raft, counting replicas only commits a record of the leader's own term: an older
term's record stored on a majority could still be overwritten by a leader chosen for a
longer older-term log (Raft's "figure 8"), so it becomes committed with the first
current-term record above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamwal.node.divergence import History, log_divergence
from streamwal.proto import streaming_pb2 as pb


def majority(members: int) -> int:
    return members // 2 + 1


def commit_offset(
    current: int, leader_end: int, acked: Sequence[int], members: int, term_start: int
) -> int:
    """The commit offset after an ack or a local sync; never moves back, never passes
    `leader_end` (the leader's durable end: followers may hold more, streamed before it).

    `acked` holds the followers' acknowledged log ends (a follower not heard from under
    this term counts as 0); `term_start` is the leader's log end when it took its term.
    """
    ends = sorted([leader_end, *acked, *[0] * (members - 1 - len(acked))], reverse=True)
    candidate = min(ends[majority(members) - 1], leader_end)
    if candidate > current and candidate > term_start:
        return candidate
    return current


def quorum_ack(level: int, members: int) -> bool:
    """Whether a producer at `level` is answered only once its batch is committed."""
    if level == pb.ACK_LEVEL_QUORUM:
        return True
    return level == pb.ACK_LEVEL_DEFAULT and members > 1


@dataclass(frozen=True)
class Start:
    """Where the leader starts streaming to a follower that just connected."""

    position: int  # first offset to send; also what the follower is known to hold
    truncate_from: int | None  # the follower cuts its log here first


def follower_start(
    follower_history: History, follower_end: int, leader_history: History, leader_end: int
) -> Start:
    cut = log_divergence(follower_history, follower_end, leader_history, leader_end)
    return Start(follower_end if cut is None else cut, cut)


class Rejected(Exception):
    """A LogEntry the follower must not apply; the message says why."""


def check_entry(
    follow_term: int,
    accepted_term: int,
    entry_term: int,
    entry_offset: int | None = None,
    log_end: int = 0,
) -> None:
    """Raises Rejected unless an entry may be applied: it comes from the term followed,
    not below the accepted one, and a record entry (`entry_offset` given) continues the
    follower's log at `log_end`. Every entry passes here (cuts and commit updates too)."""
    if entry_term < accepted_term:
        raise Rejected(f"entry from term {entry_term} below the accepted term {accepted_term}")
    if entry_term != follow_term:
        raise Rejected(f"entry from term {entry_term}, following term {follow_term}")
    if entry_offset is not None and entry_offset != log_end:
        raise Rejected(f"entry at offset {entry_offset}, log ends at {log_end}")


def check_truncate(truncate_from: int, log_end: int) -> None:
    """Raises Rejected if a cut is impossible; a cut below the known commit offset is not
    refused (the leader's log wins; the caller logs it as an unclean failover)."""
    if truncate_from > log_end:
        raise Rejected(f"cut at {truncate_from} beyond the log end {log_end}")
