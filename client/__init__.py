"""streamwal's client API. `streamwal.client.connect(coord=...)` returns the blocking WAL
accessor; `streamwal.client.aio.connect` is its asyncio twin.

This is the one part folder with an `__init__.py` (a home for `connect`); it imports
nothing at import time, so `import streamwal.client.node_client` stays as cheap as before.
See docs/decisions-accessor.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamwal.client.sync_accessor import SyncWALAccessor


def connect(coord: str | None = None, **options) -> SyncWALAccessor:
    """The blocking WAL accessor; options as `streamwal.client.aio.connect`."""
    from streamwal.client.sync_accessor import open_blocking

    return open_blocking(coord, **options)


# Names re-exported from `streamwal.client.aio` on first use. The set is spelled out: an
# unknown name must fail without importing anything, because `from streamwal.client import
# encoding` inside the client's own modules asks this hook first (importing the accessor
# from there would be circular).
_EXPORTS = frozenset(
    {
        "AppendOption", "AppendResponses", "AppendResult", "BroadcastAppendResult",
        "DeliverFilter", "DeliverPolicy", "Message", "MsgPack", "MsgPosition", "MsgType",
        "ResourceKey", "TsMsg", "WALAccessor", "WALLocatedRemote", "hash_key",
    }
)  # fmt: skip


def __getattr__(name: str):
    """`Message`, `MsgPack`, `DeliverPolicy`, ... as in `streamwal.client.aio`, on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'streamwal.client' has no attribute {name!r}")
    return getattr(importlib.import_module("streamwal.client.aio"), name)
