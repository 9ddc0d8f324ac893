"""The coord's one view of the pchannel records: persisted first, locked per pchannel.

Every change of a record goes through `persist`, which writes the meta store first and
only then updates the view, the metrics and the assignment hub that AssignmentDiscover
publishes: nothing is acted on or told to anyone before it is durable. Work on one
pchannel (a reassignment, a term change, a destroy) holds its `lock`; `refresh` (a store
shared with another writer, the Kubernetes operator) skips locked pchannels, so a record
is never replaced under a running change. Readers get read-only views.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from streamwal.coord.discovery import AssignmentHub
from streamwal.coord.meta_store import MetaStore, Stored, VersionConflict
from streamwal.coord.metrics import CoordMetrics
from streamwal.coord.replica_set import held_by, is_replicated
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.coord")


DISCOVERY_INTERVAL = 0.05  # seconds: AssignmentDiscover publishes at most this often


class ChannelRecords:
    """The records of one meta store, as the coord that owns it sees them."""

    def __init__(self, store: MetaStore, metrics: CoordMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self.hub = AssignmentHub(0)
        self._stored: dict[str, Stored] = {}
        self._held: dict[int, set[str]] = {}  # node -> pchannels whose records name it
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: set[str] = set()  # names set since the last `take_changed`
        self.version = 0  # raised by every change of the view

    async def load(self, incarnation: int) -> None:
        """Read every record; a fresh hub publishes them under `incarnation`."""
        self.hub = AssignmentHub(incarnation, DISCOVERY_INTERVAL)
        self._stored, self._held = {}, {}
        for stored in await self.store.list_channels():
            self._set(stored.name, stored)
        for name, stored in self._stored.items():
            self.metrics.set_channel(None if stored.record.destroyed else stored.record.meta, name)
        self.hub.update(self.metas().values())

    # ----------------------------------------------------------------- reads

    def all(self) -> Mapping[str, Stored]:
        """Every record with its version, tombstones (destroyed) included; read-only."""
        return MappingProxyType(self._stored)

    def held(self) -> Mapping[int, AbstractSet[str]]:
        """Per node, the live pchannels whose records name it (owner or member,
        `planner.held_by`): what its reports are checked against, without a walk over
        every record per probe (issue 24: 10,000 pchannels)."""
        return MappingProxyType(self._held)

    def take_changed(self) -> set[str]:
        """The pchannels whose record changed (persisted, refreshed, loaded) since the
        last call: what the next planning round must look at (`planner.plan`'s dirty)."""
        changed, self._changed = self._changed, set()
        return changed

    def get(self, name: str) -> Stored | None:
        return self._stored.get(name)

    def live(self, name: str) -> cpb.ChannelRecord | None:
        """The record of `name` unless it is unknown or destroyed."""
        stored = self._stored.get(name)
        return None if stored is None or stored.record.destroyed else stored.record

    def metas(self) -> dict[str, pb.PChannelMeta]:
        """The meta of every live (not destroyed) pchannel."""
        return {n: s.record.meta for n, s in self._stored.items() if not s.record.destroyed}

    def replicated(self) -> dict[str, Stored]:
        """Live replicated pchannels (replicas > 1)."""
        return {
            n: s
            for n, s in self._stored.items()
            if not s.record.destroyed and is_replicated(s.record)
        }

    def copy(self, name: str) -> cpb.ChannelRecord:
        """A copy of the record of `name` to change and `persist` (KeyError if unknown)."""
        record = cpb.ChannelRecord()
        record.CopyFrom(self._stored[name].record)
        return record

    # ----------------------------------------------------------------- changes

    def _set(self, name: str, stored: Stored | None) -> None:
        """Replace the view's record of `name` (None: gone), keeping `held` in step."""
        self._changed.add(name)
        self.version += 1
        old = self._stored.get(name)
        for node in held_by(old.record) if old is not None else ():
            names = self._held[node]
            names.discard(name)
            if not names:
                del self._held[node]
        if stored is None:
            self._stored.pop(name, None)
            return
        self._stored[name] = stored
        for node in held_by(stored.record):
            self._held.setdefault(node, set()).add(name)

    def lock(self, name: str) -> asyncio.Lock:
        """Held by whatever works on `name`; one change of a pchannel at a time."""
        return self._locks.setdefault(name, asyncio.Lock())

    async def persist(self, name: str, record: cpb.ChannelRecord) -> None:
        """Write the store first; then update the view, metrics and the published versions.

        Raises VersionConflict when another writer changed the record: the view then holds
        their version, and the caller's next round decides again."""
        previous = self._stored.get(name)
        try:
            stored = await self.store.put_channel(record, previous.version if previous else None)
        except VersionConflict:
            fresh = await self.store.get_channel(name)
            self._set(name, fresh)
            raise
        self._set(name, stored)
        self.metrics.set_channel(None if record.destroyed else record.meta, name)
        if self.hub.change(name, None if record.destroyed else record.meta):
            self.metrics.assignment_changes.inc()

    async def refresh(self) -> bool:
        """Re-read the store: pick up pchannels created, changed or deleted by others.

        Pchannels being worked on (their lock held) are skipped: replacing their record
        under a running change would let it write over a newer version. True on change."""
        stored = {s.name: s for s in await self.store.list_channels()}
        changed = False
        for name in sorted(set(self._stored) | set(stored)):
            if self.lock(name).locked():
                continue
            old, new = self._stored.get(name), stored.get(name)
            if old is not None and new is not None and old.version == new.version:
                continue
            changed = True
            self._set(name, new)
            if new is None:
                self.metrics.set_channel(None, name)
            else:
                self.metrics.set_channel(None if new.record.destroyed else new.record.meta, name)
        if changed and self.hub.update(self.metas().values()):
            self.metrics.assignment_changes.inc()
        return changed
