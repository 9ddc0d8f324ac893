"""The assignment view pushed to clients by AssignmentDiscover, with its version.

The view is every ASSIGNED pchannel grouped by node. `VersionPair.global` is the coord's
incarnation (persisted, bumped at every start, so a restarted coord's versions are all
newer), `local` counts published changes within the incarnation.

Changes are kept per pchannel as they are persisted (O(1) each) and published together
at most once per `flush_interval` (issue 24: every persist used to rebuild and push the
whole table, twice per moved pchannel; 1,024 pchannels placed were thousands of full
tables to every client). A flush that changed something bumps `local` once and sends:

- to a seed client (Milvus's streaming.proto, no option): the full table, as before;
- to a client that asked for deltas (gRPC metadata `streamwal-discovery: deltas`): the
  full table once, then an `AssignmentDelta` per flush carrying only what moved, from
  the version it applies to (`base`) to the new one. Such a client reconnecting with
  `streamwal-discovery-from: GLOBAL.LOCAL` gets the deltas since then, when the hub still
  holds them (the last `HISTORY` flushes of this incarnation), else the full table.

Each stream sees every published version, in order, with none skipped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from streamwal.coord import state_machine as sm
from streamwal.proto import streaming_pb2 as pb

Entry = tuple[int, str, int]  # (node id, node address, term) of an ASSIGNED pchannel
Version = tuple[int, int]
Queue = asyncio.Queue[pb.AssignmentDiscoverResponse | None]

# A subscriber that falls this far behind is cut off (it reconnects and gets the full view).
MAX_PENDING = 10_000
HISTORY = 1_000  # flushes kept for clients resuming from a version
DELTAS = "streamwal-discovery"  # metadata key; value "deltas" (client/discovery.py)
RESUME_FROM = "streamwal-discovery-from"  # metadata key; value "GLOBAL.LOCAL"


def entry(meta: pb.PChannelMeta | None) -> Entry | None:
    if meta is None or meta.state != sm.ASSIGNED:
        return None
    return (meta.node.server_id, meta.node.address, meta.channel.term)


def _version(incarnation: int, local: int) -> pb.VersionPair:
    return pb.VersionPair(**{"global": incarnation, "local": local})  # `global`: a keyword


def _grouped(entries: Iterable[tuple[str, Entry]]) -> list[pb.StreamingNodeAssignment]:
    by_node: dict[tuple[int, str], list[pb.PChannelInfo]] = {}
    for name, (server_id, address, term) in sorted(entries, key=lambda e: (e[1], e[0])):
        by_node.setdefault((server_id, address), []).append(pb.PChannelInfo(name=name, term=term))
    return [
        pb.StreamingNodeAssignment(
            node=pb.StreamingNodeInfo(server_id=server_id, address=address), channels=channels
        )
        for (server_id, address), channels in sorted(by_node.items())
    ]


def build(view: dict[str, Entry], incarnation: int, local: int) -> pb.AssignmentDiscoverResponse:
    full = pb.FullStreamingNodeAssignmentWithVersion(
        version=_version(incarnation, local), assignments=_grouped(view.items())
    )
    return pb.AssignmentDiscoverResponse(full_assignment=full)


def parse_version(text: str | None) -> Version | None:
    """ "GLOBAL.LOCAL" (the metadata a resuming client sends); None if absent or garbled."""
    try:
        incarnation, local = (text or "").split(".")
        return int(incarnation), int(local)
    except ValueError:
        return None


class AssignmentHub:
    """Holds the current view and fans coalesced changes out to subscriber queues."""

    def __init__(self, incarnation: int, flush_interval: float = 0.0) -> None:
        self.incarnation = incarnation
        self.flush_interval = flush_interval  # 0: publish every change at once
        self.local = 0
        self._view: dict[str, Entry] = {}
        self._published: dict[str, Entry] = {}
        self._dirty: set[str] = set()
        self._scheduled: asyncio.TimerHandle | None = None
        self._current: pb.AssignmentDiscoverResponse | None = None
        self._history: deque[pb.AssignmentDiscoverResponse] = deque(maxlen=HISTORY)
        self._subscribers: dict[Queue, bool] = {}  # queue -> wants deltas

    @property
    def current(self) -> pb.AssignmentDiscoverResponse:
        """The full table as last published."""
        if self._current is None:
            self._current = build(self._published, self.incarnation, self.local)
        return self._current

    def change(self, name: str, meta: pb.PChannelMeta | None) -> bool:
        """One pchannel's meta changed (None: gone). True if the view changed."""
        new = entry(meta)
        if self._view.get(name) == new:
            return False
        if new is None:
            del self._view[name]
        else:
            self._view[name] = new
        self._mark([name])
        return True

    def update(self, metas: Iterable[pb.PChannelMeta]) -> bool:
        """Replace the whole view (a load or a re-read of the store). True on change."""
        view = {m.channel.name: e for m in metas if (e := entry(m)) is not None}
        changed = {n for n in view.keys() | self._view.keys() if view.get(n) != self._view.get(n)}
        if not changed:
            return False
        self._view = view
        self._mark(changed)
        return True

    def _mark(self, names: Iterable[str]) -> None:
        self._dirty.update(names)
        if self.flush_interval <= 0:
            self.flush()
            return
        if self._scheduled is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = loop.call_later(self.flush_interval, self.flush)

    def flush(self) -> None:
        """Publish what changed since the last flush (nothing: no new version)."""
        self._scheduled = None
        dirty, self._dirty = self._dirty, set()
        moved = {n for n in dirty if self._view.get(n) != self._published.get(n)}
        if not moved:
            return
        base = self.local
        self.local += 1
        for name in moved:
            if name in self._view:
                self._published[name] = self._view[name]
            else:
                self._published.pop(name, None)
        delta = pb.AssignmentDelta(
            base=_version(self.incarnation, base),
            version=_version(self.incarnation, self.local),
            assigned=_grouped((n, self._view[n]) for n in moved if n in self._view),
            unassigned=sorted(n for n in moved if n not in self._view),
        )
        as_delta = pb.AssignmentDiscoverResponse(delta=delta)
        self._history.append(as_delta)
        self._current = None
        full = self.current if not all(self._subscribers.values()) else None
        for queue, deltas in list(self._subscribers.items()):
            if queue.qsize() >= MAX_PENDING:
                del self._subscribers[queue]
                queue.put_nowait(None)
            else:
                queue.put_nowait(as_delta if deltas else full)

    def subscribe(self, deltas: bool = False, since: Version | None = None) -> Queue:
        """A queue that starts with the current view (or, for a delta subscriber resuming
        from `since`, the deltas after it) and then gets every change."""
        queue: Queue = asyncio.Queue()
        missed = self._since(since) if deltas else None
        if missed is None:
            queue.put_nowait(self.current)
        else:
            for response in missed:
                queue.put_nowait(response)
        self._subscribers[queue] = deltas
        return queue

    def _since(self, since: Version | None) -> list[pb.AssignmentDiscoverResponse] | None:
        """The deltas after `since`, or None when they are not all held (send the table)."""
        if since is None or since[0] != self.incarnation or since[1] > self.local:
            return None
        if since[1] == self.local:  # up to date: an empty delta says the stream is on
            version = _version(self.incarnation, self.local)
            return [
                pb.AssignmentDiscoverResponse(
                    delta=pb.AssignmentDelta(base=version, version=version)
                )
            ]
        held = [r for r in self._history if r.delta.base.local >= since[1]]
        if not held or held[0].delta.base.local != since[1]:
            return None
        return held

    def unsubscribe(self, queue: Queue) -> None:
        self._subscribers.pop(queue, None)

    def close_all(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        for queue in list(self._subscribers):
            queue.put_nowait(None)
        self._subscribers.clear()
