"""`streamwal.client.aio.connect`: the asyncio WAL accessor.

from streamwal.client.aio import connect, Message

wal = await connect(coord="127.0.0.1:19500")
result = await wal.raw_append(Message("pchannel_0_v1", b"hello"))
await wal.close()
"""

from __future__ import annotations

import asyncio
import os

from streamwal.client.accessor import WALAccessor, WALLocatedRemote
from streamwal.client.append import AppendOption, AppendResponses, AppendResult, Message
from streamwal.client.broadcast import BroadcastAppendResult
from streamwal.client.kube_discovery import coord_address_in_namespace
from streamwal.client.msgstream_types import MsgPack, MsgPosition, TsMsg, hash_key
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.wal import open_wal
from streamwal.errors import InvalidArgument, Unavailable
from streamwal.message import MsgType, ResourceKey
from streamwal.transport import TransportConfig


async def connect(
    coord: str | None = None,
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    service: str | None = None,
    timeout: float = 10.0,
    failover_timeout: float = 30.0,
    transport: TransportConfig | None = None,
) -> WALAccessor:
    """The WAL accessor of the cluster whose coord is at `coord` (HOST:PORT; default: the
    STREAMWAL_COORD variable, as the CLI), or of the streamwal installation in Kubernetes
    `namespace` (its coord Service; `kubeconfig` and `service` as in
    `kube_discovery.coord_address_in_namespace`).

    `timeout` bounds the wait for the first assignment; `failover_timeout` how long an
    append or read waits for a pchannel's next owner."""
    if coord is None and namespace is None:
        coord = os.environ.get("STREAMWAL_COORD") or None
    if (coord is None) == (namespace is None):
        raise InvalidArgument(
            "connect needs either coord='HOST:PORT' (or STREAMWAL_COORD) or namespace='NS'"
        )
    if namespace is not None:
        coord = await asyncio.to_thread(
            coord_address_in_namespace, namespace, kubeconfig=kubeconfig, service=service
        )
        await _resolvable(coord, namespace)
    wal = await open_wal(
        coord, timeout=timeout, failover_timeout=failover_timeout, transport=transport
    )
    return WALAccessor(wal, transport)


async def _resolvable(address: str, namespace: str) -> None:
    """Fail at once, saying why, where the coord Service's cluster DNS name does not
    resolve (outside the cluster): the wait for its first assignment would end in "is the
    coord running?" after `timeout`."""
    host, _, port = address.rpartition(":")
    try:
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None), 5.0)
    except (OSError, TimeoutError):
        raise Unavailable(
            f"{host} does not resolve here: connect(namespace=...) reaches the coord by its "
            "cluster DNS name, from a pod of the cluster. From outside, forward its port "
            f"(kubectl -n {namespace} port-forward svc/{host.split('.')[0]} {port}) and "
            f"connect(coord='127.0.0.1:{port}'); the nodes must be reachable too, at the pod "
            "addresses the coord hands out"
        ) from None


__all__ = [
    "AppendOption",
    "AppendResponses",
    "AppendResult",
    "BroadcastAppendResult",
    "DeliverFilter",
    "DeliverPolicy",
    "Message",
    "MsgPack",
    "MsgPosition",
    "MsgType",
    "ResourceKey",
    "TsMsg",
    "WALAccessor",
    "WALLocatedRemote",
    "connect",
    "hash_key",
]
