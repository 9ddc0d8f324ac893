"""The resource-key lock table of broadcasts: who holds which key, and who may take it.

A broadcast holds its keys from its append until it is acked on every vchannel. An
exclusive key conflicts with any other holder of the same (domain, key); a shared key
only with an exclusive holder. A conflicting broadcast is refused at once (no queue):
the caller decides whether to wait (`block_until_resource_key_ack_all`) and retry.

Pure bookkeeping, rebuilt from the persisted tasks when the coord starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamwal.errors import InvalidArgument, ResourceKeyConflict
from streamwal.message import ResourceKey


def normalize(keys: Iterable[ResourceKey]) -> list[ResourceKey]:
    """One key per (domain, key), exclusive when any mention is; sorted; empty names refused."""
    merged: dict[tuple[str, str], bool] = {}
    for k in keys:
        if not k.domain or not k.key:
            raise InvalidArgument(
                f"resource key {k.domain!r}:{k.key!r}: domain and key are required"
            )
        merged[k.name] = merged.get(k.name, True) and k.shared
    return [ResourceKey(d, n, shared) for (d, n), shared in sorted(merged.items())]


class ResourceKeyTable:
    """Holders per (domain, key): {broadcast id: shared}."""

    def __init__(self) -> None:
        self._holders: dict[tuple[str, str], dict[int, bool]] = {}
        self._held: dict[int, list[ResourceKey]] = {}

    def conflict(
        self, keys: Iterable[ResourceKey], broadcast_id: int
    ) -> tuple[ResourceKey, int] | None:
        """The first (key, holder id) that `keys` would conflict with, else None."""
        for k in keys:
            for holder, shared in sorted(self._holders.get(k.name, {}).items()):
                if holder != broadcast_id and not (shared and k.shared):
                    return k, holder
        return None

    def acquire(self, broadcast_id: int, keys: Iterable[ResourceKey]) -> None:
        """Take every key for `broadcast_id`, or none (ResourceKeyConflict names the holder)."""
        keys = normalize(keys)
        found = self.conflict(keys, broadcast_id)
        if found is not None:
            key, holder = found
            raise ResourceKeyConflict(
                f"resource key {key} is held by broadcast {holder} until it is acked on "
                "every vchannel"
            )
        for k in keys:
            self._holders.setdefault(k.name, {})[broadcast_id] = k.shared
        self._held[broadcast_id] = keys

    def release(self, broadcast_id: int) -> None:
        for k in self._held.pop(broadcast_id, []):
            holders = self._holders.get(k.name, {})
            holders.pop(broadcast_id, None)
            if not holders:
                self._holders.pop(k.name, None)

    def holders(self, domain: str, key: str) -> set[int]:
        return set(self._holders.get((domain, key), {}))

    def held_by(self, broadcast_id: int) -> list[ResourceKey]:
        return list(self._held.get(broadcast_id, []))
