"""Which replica leads a pchannel under a new term: pure decision on Fence reports, no I/O.

Before a replicated pchannel gets a new leader, the coord persists the new term and fences
the replicas at it (`Fence`): each one that answers has raised its accepted term, so it no
longer takes entries from the old leader, and it reports its log's end (the term of its
last record and its next offset). The leader is the answering replica with the highest
``(last_term, next_offset)``, and only once a majority of every voting set has answered.

Why the maximum over a majority never misses a committed message:

- a message is committed once it is stored on a majority of the replica set of its term;
  any two majorities of one set share a replica, so at least one fenced replica holds it;
- fencing that majority at the new term means the old leader can no longer reach a
  quorum, so nothing becomes committed after the reports were taken;
- there is one leader per term (the coord bumps the term for every choice, also when it
  resumes a half-done one), and followers cut whatever diverges from their leader's log
  (term history, KIP-101), so two logs whose last records have the same term are prefixes
  of that term leader's log: the longer one holds everything the shorter one does;
- a log whose last record has a higher term was written by a later leader, which (by
  induction over terms) held every message committed before it: so the replica with the
  highest (last_term, next_offset) holds every committed message.

The last point needs one thing from the node: a leader counts a quorum only for offsets of
its own term (it appends a record of its term first), as Raft does (its figure 8);
otherwise a later leader could be chosen over a copied, "committed" older-term entry.

While the replica set changes (a lost replica replaced), the previous set votes too (joint
quorum): a message committed under the old set may still be missing from a majority of
the new one, so a choice needs answers that meet every majority of both sets until the
new members have caught up (`has_quorum`: a majority of an odd set, half of an even one).

A replica whose log lacks records it acknowledged (corruption found by the node: a
`data_loss` answer) breaks the induction above: its position no longer says what it
holds. It still votes (its term is fenced) but never leads, as Kafka's eligible leader
replicas (KIP-966). Its commit offset covers every offset it acknowledged: a follower's
acknowledgement means the record reached the leader and it, which in a set of 3 is a
majority, so the leader chosen must hold those too, or the pchannel waits. A replica that
cannot serve well (its writes fail, it lost its quorum as leader, its clock is far off)
is ineligible the same way; its log is whole, so the best eligible log may be shorter
than its own only by what was never committed (a committed record is on a majority, and
the check against the known commit offset catches the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FenceReport:
    """What one replica answered to Fence: the end of its log and what it knows committed."""

    node: int
    last_term: int
    next_offset: int
    commit_offset: int = 0
    # Why this replica may vote but not lead ("": it may lead): its log lacks acknowledged
    # records, or it cannot serve well (WAL writes failing, no quorum, a clock far off).
    ineligible: str = ""

    @property
    def position(self) -> tuple[int, int]:
        return (self.last_term, self.next_offset)


@dataclass(frozen=True)
class Choice:
    """The new leader and the log end it starts from (everything committed is below it)."""

    leader: int
    next_offset: int


@dataclass(frozen=True)
class NoChoice:
    """Why no leader can be chosen now (the pchannel waits; nothing was lost)."""

    reason: str


def majority(size: int) -> int:
    """Replicas that make a quorum of a set of `size`."""
    return size // 2 + 1


def read_quorum(size: int) -> int:
    """Replicas of a set of `size` that meet every majority of it (a node commits on a
    majority of its set): a majority when `size` is odd, half of it when even."""
    return size - majority(size) + 1


def has_quorum(answered: Collection[int], voters: Sequence[Collection[int]]) -> bool:
    """Whether `answered` meets every majority of every non-empty voting set: then it holds
    every committed record and, fenced, leaves no old leader a quorum to commit with.

    For odd sets that is a majority. An even set is only ever a previous set (a set
    placed with one node missing, then grown: 2 of 3, joint until the third has the log),
    and there it is half: a record committed by a set of 2 is on both, so either one
    holds it, and fencing either one stops the old leader. Requiring 2 of 2 left such a
    pchannel without a leader when its leader died before the change completed.
    """
    got = set(answered)
    return all(len(got & set(v)) >= read_quorum(len(set(v))) for v in voters if v)


def choose_leader(
    reports: Mapping[int, FenceReport],
    voters: Sequence[Collection[int]],
    candidates: Collection[int],
    rank: Callable[[int], tuple] = lambda node: (node,),
) -> Choice | NoChoice:
    """The leader among `candidates` (members of the new set) from fence `reports`.

    Only the reports of voters count (a node joining the set may hold an old, divergent
    log). Among the voters' best whole logs, the lowest `rank` wins (the caller prefers
    the current leader, then less loaded nodes). A best log held by no candidate, or a
    best log shorter than an offset some replica knows committed, means no choice.
    """
    voting = {n for v in voters for n in v}
    counted = {n: r for n, r in reports.items() if n in voting}
    if not has_quorum(counted, voters):
        sizes = "+".join(str(len(set(v))) for v in voters if v)
        return NoChoice(f"{len(counted)} of {sizes} voting replicas answered: no majority")
    whole = {n: r for n, r in counted.items() if not r.ineligible}
    if not whole:
        why = "; ".join(f"{n}: {r.ineligible}" for n, r in sorted(counted.items()))
        return NoChoice(f"no answering replica may lead ({why})")
    best = max(r.position for r in whole.values())
    holders = sorted((n for n, r in whole.items() if r.position == best), key=rank)
    eligible = [n for n in holders if n in set(candidates)]
    if not eligible:
        return NoChoice(f"the most complete log (term {best[0]}, end {best[1]}) is on {holders}")
    committed = max(r.commit_offset for r in counted.values())
    if best[1] < committed:
        return NoChoice(
            f"the most complete log ends at {best[1]} below the known commit offset {committed}"
        )
    return Choice(eligible[0], best[1])
