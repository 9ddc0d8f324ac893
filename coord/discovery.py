"""The assignment view pushed to clients by AssignmentDiscover, with its version.

The view is every ASSIGNED pchannel grouped by node. `VersionPair.global` is the coord's
incarnation (persisted, bumped at every start, so a restarted coord's versions are all
newer), `local` counts changes within the incarnation. Every change is queued to every
subscriber, so each stream sees every version, in order, with none skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from streamwal.coord import state_machine as sm
from streamwal.proto import streaming_pb2 as pb

ViewKey = tuple[tuple[int, str, str, int], ...]

# A subscriber that falls this far behind is cut off (it reconnects and gets the full view).
MAX_PENDING = 10_000


def view_key(metas: Iterable[pb.PChannelMeta]) -> ViewKey:
    """A comparable summary of who owns what: (node id, address, pchannel, term)."""
    return tuple(
        sorted(
            (m.node.server_id, m.node.address, m.channel.name, m.channel.term)
            for m in metas
            if m.state == sm.ASSIGNED
        )
    )


def build(key: ViewKey, incarnation: int, local: int) -> pb.AssignmentDiscoverResponse:
    # `global` is a Python keyword, hence the dict.
    version = pb.VersionPair(**{"global": incarnation, "local": local})
    full = pb.FullStreamingNodeAssignmentWithVersion(version=version)
    by_node: dict[tuple[int, str], list[pb.PChannelInfo]] = {}
    for server_id, address, name, term in key:
        by_node.setdefault((server_id, address), []).append(pb.PChannelInfo(name=name, term=term))
    for (server_id, address), channels in sorted(by_node.items()):
        full.assignments.add(
            node=pb.StreamingNodeInfo(server_id=server_id, address=address), channels=channels
        )
    return pb.AssignmentDiscoverResponse(full_assignment=full)


class AssignmentHub:
    """Holds the current view and fans every change out to subscriber queues."""

    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation
        self.local = 0
        self._key: ViewKey | None = None
        self._current = build((), incarnation, 0)
        self._subscribers: set[asyncio.Queue[pb.AssignmentDiscoverResponse | None]] = set()

    @property
    def current(self) -> pb.AssignmentDiscoverResponse:
        return self._current

    def update(self, metas: Iterable[pb.PChannelMeta]) -> bool:
        """Recompute the view; on change bump `local` and push it. Returns True on change."""
        key = view_key(metas)
        if key == self._key:
            return False
        self._key = key
        self.local += 1
        self._current = build(key, self.incarnation, self.local)
        for queue in list(self._subscribers):
            if queue.qsize() >= MAX_PENDING:
                self._subscribers.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(self._current)
        return True

    def subscribe(self) -> asyncio.Queue[pb.AssignmentDiscoverResponse | None]:
        """A queue that starts with the current view and then gets every change."""
        queue: asyncio.Queue[pb.AssignmentDiscoverResponse | None] = asyncio.Queue()
        queue.put_nowait(self._current)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._subscribers.discard(queue)

    def close_all(self) -> None:
        for queue in list(self._subscribers):
            queue.put_nowait(None)
        self._subscribers.clear()
