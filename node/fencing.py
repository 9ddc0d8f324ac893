"""Term fencing: the rules that keep a stale owner from ever appending.

Pure decisions over a pchannel's persisted fence (the highest term accepted and whether
the node still serves it). The node persists the fence before acting on an Assign, so
these rules hold across restarts. Codes follow DESIGN.md's invariants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from streamwal.errors import (
    ChannelFenced,
    ChannelNotExist,
    DataLoss,
    IgnoredOperation,
    InvalidArgument,
    UnmatchedChannelTerm,
)
from streamwal.node.channel_meta import ChannelMeta


@dataclass(frozen=True)
class Fence:
    """What the node knows of a pchannel: highest accepted term, still serving (both
    durable), and whether it is recovering: restarted and not yet re-assigned.

    A restarted node does not trust its own `serving`: the coord may have moved the
    pchannel while it was down, so it waits for an Assign before serving again.
    """

    term: int
    serving: bool
    recovering: bool = False
    # False when `term` was only fenced (Fence RPC), not yet assigned here: an Assign at
    # that same term is still to be taken.
    assigned: bool = True
    # Set while this node follows the leader at that address: it serves no client.
    following: str = ""
    # A higher term this node is taking (persisting it, catching up): until it is in
    # place, neither the old term nor the new one is served.
    taking: int = 0
    # Why the log here lacks acknowledged records, if it does: nobody is served until it
    # is rebuilt from a replica or the loss is accepted (Wal.assign).
    damage: str = ""

    @staticmethod
    def of(meta: ChannelMeta, recovering: bool, following: str, taking: int, damage: str) -> Fence:
        """The fence of a pchannel from its persisted meta and what the node holds now."""
        assigned = meta.assigned_term == meta.term
        return Fence(meta.term, meta.serving, recovering, assigned, following, taking, damage)


class AssignOutcome(Enum):
    TAKE = "take"  # a newer term: persist it, then serve under it
    ALREADY = "already"  # the same term again: idempotent success
    RESUME = "resume"  # the same term after a restart: serve again, nothing to persist


def decide_assign(fence: Fence | None, term: int) -> AssignOutcome:
    if term < 1:
        raise IgnoredOperation(f"term must be >= 1, got {term}")
    if fence is None or term > fence.term or (term == fence.term and not fence.assigned):
        return AssignOutcome.TAKE
    if term == fence.term and fence.serving:
        return AssignOutcome.RESUME if fence.recovering else AssignOutcome.ALREADY
    raise IgnoredOperation(
        f"assign with term {term} ignored: term {fence.term} already accepted"
        + ("" if fence.serving else " and released")
    )


def damage(bad_from: int | None, bad_reason: str, log_end: int, acknowledged_end: int) -> str:
    """Why a node's log of a pchannel may lack acknowledged records ("": whole): a record
    found unreadable from `bad_from`, or a log ending below what the node acknowledged."""
    if bad_from is not None:
        return f"the log is damaged from offset {bad_from}: {bad_reason}"
    if log_end < acknowledged_end:
        return (
            f"the log ends at offset {log_end} but this node acknowledged "
            f"offsets up to {acknowledged_end - 1}"
        )
    return ""


def decide_damaged_assign(
    name: str,
    damage: str,
    needs_salvage: bool,
    following: bool,
    accept_loss: bool,
    outcome: AssignOutcome,
) -> bool:
    """Whether an Assign may take a log that lacks acknowledged records (`damage`), and
    must first cut its damaged part (True); raises the refusal otherwise.

    A damaged log is never led: a follower cuts the damaged part and copies it again from
    its leader; a single replica is served only when the loss is accepted, under a new
    term (its start is what keeps the lost offsets from being handed out again). A table
    block RocksDB itself cannot read needs the store salvaged first (node/salvage.py).
    """
    if not damage:
        return False
    if needs_salvage:
        raise DataLoss(
            f"pchannel {name!r} lost acknowledged records on this node: {damage}. The store "
            "has a damaged table file: restart the node, it salvages its store at start-up; "
            "then rebuild or accept the loss"
        )
    if following:
        return True
    if not accept_loss:
        raise DataLoss(
            f"pchannel {name!r} lost acknowledged records on this node: {damage}. Rebuild "
            "it from a replica, or accept the loss explicitly (`streamwal channel accept-loss`)"
        )
    if outcome is not AssignOutcome.TAKE:
        raise InvalidArgument(f"accepting the data loss of {name!r} needs a new term")
    return True


def decide_remove(fence: Fence | None, name: str, term: int) -> None:
    """Raises unless a Remove with `term` may release the pchannel."""
    if fence is None or not fence.serving:
        raise ChannelNotExist(f"pchannel {name!r} is not served by this node")
    if term < fence.term:
        raise IgnoredOperation(
            f"remove of {name!r} with term {term} ignored: serving term {fence.term}"
        )


def check_access(fence: Fence | None, name: str, term: int) -> None:
    """Raises the error a Produce or Consume under `term` must get, if any."""
    if fence is None:
        raise ChannelNotExist(f"pchannel {name!r} was never assigned to this node")
    if not fence.assigned:
        raise ChannelFenced(f"pchannel {name!r} is fenced at term {fence.term}, not assigned")
    if not fence.serving:
        raise ChannelFenced(f"pchannel {name!r} moved away or was removed (term {fence.term})")
    if fence.recovering:
        raise ChannelNotExist(
            f"pchannel {name!r} is recovering after a node restart: not assigned again yet"
        )
    if fence.taking:
        if term < fence.taking:
            raise UnmatchedChannelTerm(
                f"pchannel {name!r} term {term} is stale: the node is taking term {fence.taking}"
            )
        raise UnmatchedChannelTerm(
            f"pchannel {name!r} term {term} is not served yet: the node is still taking it"
        )
    if fence.damage:
        raise DataLoss(f"pchannel {name!r} lost acknowledged records on this node: {fence.damage}")
    if fence.following:
        raise ChannelFenced(
            f"pchannel {name!r} is a follower replica here (term {fence.term}): "
            f"produce and consume at its leader {fence.following}"
        )
    if term != fence.term:
        if term < fence.term:
            raise UnmatchedChannelTerm(
                f"pchannel {name!r} term {term} is stale: the node serves term {fence.term}"
            )
        raise UnmatchedChannelTerm(
            f"pchannel {name!r} term {term} is not assigned here: the node serves term {fence.term}"
        )
