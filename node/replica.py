"""A pchannel's replication role on this node under one term.

The leader keeps each follower's acknowledged log end and the producers waiting for the
commit offset to pass their batch; a follower keeps the task that streams from its
leader. A role lives as long as its term: a higher term (Assign, Fence) or a Remove stops
it, which fails every waiter, so a fenced leader never answers a QUORUM producer again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass

from streamwal.errors import StreamingError
from streamwal.node import replication_rules as rules


@dataclass(frozen=True)
class Member:
    node_id: int
    address: str


@dataclass
class Progress:
    """What the leader knows of one follower under its term."""

    node_id: int
    ordinal: int
    acked: int = 0  # every offset below is stored and synced there
    connected: bool = False
    heard_at: float = 0.0  # monotonic time of its last ack (or of the role's start)


class LeaderRole:
    def __init__(
        self,
        term: int,
        members: list[Member],
        self_id: int,
        term_start: int,
        started_at: float = 0.0,
    ) -> None:
        self.term = term
        self.started_at = started_at  # followers are given a lease from here to connect
        self.self_id = self_id
        self.term_start = term_start  # log end when this term began
        self.members: list[Member] = []
        self.progress: dict[int, Progress] = {}
        self.set_members(members)
        self.stopped: StreamingError | None = None
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    def set_members(self, members: list[Member]) -> None:
        """A new member list under the same term keeps the progress of those that stay."""
        self.members = list(members)
        old = self.progress
        self.progress = {}
        for ordinal, m in enumerate(members):
            if m.node_id != self.self_id:
                kept = old.get(m.node_id)
                self.progress[m.node_id] = Progress(
                    m.node_id,
                    ordinal,
                    kept.acked if kept else 0,
                    bool(kept and kept.connected),
                    kept.heard_at if kept else self.started_at,
                )

    def next_commit(self, current: int, leader_end: int) -> int:
        acked = [p.acked for p in self.progress.values()]
        return rules.commit_offset(
            current, leader_end, acked, max(1, len(self.members)), self.term_start
        )

    def wait_commit(self, end: int, commit: int) -> asyncio.Future:
        """Resolves (to None) once the commit offset reaches `end`; fails if the role stops."""
        future = asyncio.get_running_loop().create_future()
        if self.stopped is not None:
            future.set_exception(self.stopped)
        elif commit >= end:
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (end, next(self._order), future))
        return future

    def release(self, commit: int) -> None:
        while self._waiters and self._waiters[0][0] <= commit:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)

    def stop(self, err: StreamingError) -> None:
        self.stopped = err
        while self._waiters:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_exception(err)


class FollowerRole:
    def __init__(self, term: int, leader: Member, ordinal: int) -> None:
        self.term = term
        self.leader = leader
        self.ordinal = ordinal
        self.task: asyncio.Task | None = None
        self.writing: asyncio.Future | None = None  # the last synced write of copied records
        self.stopped: StreamingError | None = None

    @property
    def leader_address(self) -> str:
        return f"node {self.leader.node_id} at {self.leader.address}"

    def stop(self, err: StreamingError) -> None:
        self.stopped = err
        if self.task is not None:
            self.task.cancel()


Role = LeaderRole | FollowerRole
