"""Finding the owner of each pchannel, and its retained bounds: the data source's adapters.

Three ways, one answer ({pchannel: Owner}):
- `coord`: the first full assignment pushed by the coord's AssignmentDiscover stream;
- `kubernetes`: the status of the PChannel resources (state Assigned, node.address, term),
  in-cluster or through a kubeconfig;
- `nodes`: CollectStatus of a fixed list of nodes (no coord; local set-ups and tests).

The shared client-side routing of the client/ folder is not there yet; when it lands,
the coord adapter here should use it (see docs/decisions-spark.md).
Bounds (oldest retained offset, log end) always come from the owner's CollectStatus,
and only under the owner's term, so a stale owner's view is never used.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamwal.client.node_client import NodeClient
from streamwal.errors import StreamingError, Unavailable
from streamwal.proto import streaming_pb2 as pb
from streamwal.spark.offsets import Bounds
from streamwal.spark.options import DiscoveryConfig
from streamwal.transport import make_channel

log = logging.getLogger("streamwal.spark.discovery")

_DISCOVER = "/milvus.proto.streaming.StreamingCoordAssignmentService/AssignmentDiscover"
CALL_TIMEOUT_S = 5.0
KUBE_GROUP, KUBE_VERSION, KUBE_PLURAL = "streamwal.io", "v1alpha1", "pchannels"


@dataclass(frozen=True)
class Owner:
    pchannel: str
    term: int
    address: str
    node_id: int = 0


# -- the three adapters -------------------------------------------------------------------


async def _from_coord(address: str) -> dict[str, Owner]:
    async with make_channel(address) as channel:
        call = channel.stream_stream(
            _DISCOVER,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.AssignmentDiscoverResponse.FromString,
        )()
        try:
            resp = await asyncio.wait_for(call.read(), CALL_TIMEOUT_S)
        finally:
            call.cancel()
    if resp is None or not hasattr(resp, "WhichOneof"):
        raise Unavailable(f"coord {address} closed AssignmentDiscover without an assignment")
    if resp.WhichOneof("response") != "full_assignment":
        raise Unavailable(f"coord {address} answered AssignmentDiscover without an assignment")
    owners = {}
    for a in resp.full_assignment.assignments:
        for ch in a.channels:
            owners[ch.name] = Owner(ch.name, ch.term, a.node.address, a.node.server_id)
    return owners


def owners_from_pchannel_objects(items: Iterable[dict]) -> dict[str, Owner]:
    """Owners from PChannel resources: only those Assigned with a node address."""
    owners = {}
    for item in items:
        status = item.get("status") or {}
        node = status.get("node") or {}
        name = (item.get("metadata") or {}).get("name")
        if status.get("state") != "Assigned" or not node.get("address") or not name:
            continue
        owners[name] = Owner(name, int(status.get("term") or 0), node["address"],
                             int(node.get("id") or 0))  # fmt: skip
    return owners


def _forget_loader_files(directory: str) -> None:
    """The kubernetes loader caches the files it writes by content, for the whole process
    (kube_config._temp_files); entries under a removed directory would be handed to the
    next load of the same kubeconfig (e.g. the accessor's connect(namespace=...))."""
    from kubernetes.config import kube_config

    cache = getattr(kube_config, "_temp_files", None)
    if isinstance(cache, dict):
        for key in [k for k, path in cache.items() if str(path).startswith(directory)]:
            del cache[key]


def _in_memory(data: bytes, name: str) -> str:
    """A path to `data` that is no file on disk: an anonymous memory file of this process
    (Linux memfd). It is gone with the process, however the process ends."""
    fd = os.memfd_create(f"streamwal-kube-{name}", os.MFD_CLOEXEC)
    os.write(fd, data)
    return f"/proc/self/fd/{fd}"


@functools.cache
def kube_api(kubeconfig: str | None) -> Any:
    """The Kubernetes ApiClient of this process (one per kubeconfig, built once).

    A kubeconfig with inline credentials (certificate-authority-data, client-certificate-
    data, client-key-data) is turned into files by the kubernetes client, since its TLS
    stack reads them by path; it deletes them at interpreter exit, which Spark's Python
    workers never reach (they leave by os._exit), so every job used to leave PEM files,
    private keys among them, in the temp directory. Here the loader writes them into a
    private directory, they are moved into memory files at once and the directory is
    removed. Without memfd (not Linux) they stay in that directory until normal exit.
    """
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # the mounted token and CA: no files written
        return client.ApiClient()
    scratch = tempfile.mkdtemp(prefix="streamwal-kube-")
    in_memory = hasattr(os, "memfd_create")
    cfg = client.Configuration()
    try:
        config.load_kube_config(
            config_file=kubeconfig, client_configuration=cfg, temp_file_path=scratch
        )
        if in_memory:
            for attr in ("ssl_ca_cert", "cert_file", "key_file"):
                path = getattr(cfg, attr)
                if path and path.startswith(scratch + os.sep):
                    setattr(cfg, attr, _in_memory(Path(path).read_bytes(), attr))
    finally:
        if in_memory:
            shutil.rmtree(scratch, ignore_errors=True)
            _forget_loader_files(scratch)
        else:  # pragma: no cover - not Linux
            import atexit

            atexit.register(shutil.rmtree, scratch, True)
    return client.ApiClient(cfg)


def _from_kubernetes(namespace: str, kubeconfig: str | None) -> dict[str, Owner]:
    from kubernetes import client  # the `spark` extra; only this adapter needs it

    listing = client.CustomObjectsApi(kube_api(kubeconfig)).list_namespaced_custom_object(
        KUBE_GROUP, KUBE_VERSION, namespace, KUBE_PLURAL, _request_timeout=CALL_TIMEOUT_S
    )
    return owners_from_pchannel_objects(listing.get("items", []))


async def _status(address: str) -> pb.StreamingNodeManagerCollectStatusResponse | None:
    client = NodeClient(address)
    try:
        return await asyncio.wait_for(client.collect_status(), CALL_TIMEOUT_S)
    except (StreamingError, TimeoutError) as exc:
        log.warning("node unreachable", extra={"address": address, "error": str(exc)})
        return None
    finally:
        await client.close()


async def _from_nodes(addresses: Iterable[str]) -> dict[str, Owner]:
    addresses = list(addresses)
    replies = await asyncio.gather(*(_status(a) for a in addresses))
    owners: dict[str, Owner] = {}
    for address, reply in zip(addresses, replies, strict=True):
        for ch in reply.channels if reply else ():
            known = owners.get(ch.pchannel.name)
            if known is None or ch.pchannel.term > known.term:  # the highest term wins
                owners[ch.pchannel.name] = Owner(
                    ch.pchannel.name, ch.pchannel.term, address, reply.server_id
                )
    return owners


def discover(cfg: DiscoveryConfig) -> dict[str, Owner]:
    """One snapshot of who owns what (raises Unavailable if the source cannot be read)."""
    try:
        if cfg.coord:
            return asyncio.run(_from_coord(cfg.coord))
        if cfg.kube_namespace:
            return _from_kubernetes(cfg.kube_namespace, cfg.kubeconfig)
        return asyncio.run(_from_nodes(cfg.nodes))
    except StreamingError:
        raise
    except Exception as exc:  # grpc, kubernetes, network: one typed error for callers
        raise Unavailable(f"discovery failed: {exc}") from exc


async def _bounds(owners: dict[str, Owner]) -> dict[str, Bounds]:
    by_address: dict[str, list[Owner]] = {}
    for o in owners.values():
        by_address.setdefault(o.address, []).append(o)
    addresses = list(by_address)
    replies = await asyncio.gather(*(_status(a) for a in addresses))
    out = {}
    for address, reply in zip(addresses, replies, strict=True):
        if reply is None:
            continue
        served = {c.pchannel.name: c for c in reply.channels}
        for o in by_address[address]:
            c = served.get(o.pchannel)
            if c is not None and c.pchannel.term == o.term:
                out[o.pchannel] = Bounds(c.first_offset, c.next_offset)
    return out


def locate(
    cfg: DiscoveryConfig, select: Callable[[str], bool], required: Iterable[str] = ()
) -> tuple[dict[str, Owner], dict[str, Bounds]]:
    """Owners and bounds of every selected pchannel whose owner answers.

    Retries (bounded by `cfg.timeout_s`) until every `required` pchannel is located, so a
    query waits out a failover instead of failing on it; raises Unavailable naming the
    pchannels still missing at the deadline.
    """
    required = set(required)
    deadline = time.monotonic() + cfg.timeout_s
    pause = 0.1
    while True:
        missing: set[str] = set(required)
        error = ""
        try:
            owners = {p: o for p, o in discover(cfg).items() if select(p)}
            bounds = asyncio.run(_bounds(owners))
            owners = {p: o for p, o in owners.items() if p in bounds}
            missing = required - set(owners)
            if not missing and (owners or not required):
                return owners, bounds
        except Unavailable as exc:
            error = f" ({exc})"
        if time.monotonic() + pause > deadline:
            raise Unavailable(
                f"no serving owner found for pchannel(s) {sorted(missing) or '(any)'} within "
                f"{cfg.timeout_s:g}s{error}"
            )
        time.sleep(pause)
        pause = min(1.0, pause * 2)


def owner_of(cfg: DiscoveryConfig, pchannel: str) -> tuple[Owner, Bounds]:
    """The current owner of one pchannel and its bounds (waits out a failover)."""
    owners, bounds = locate(cfg, lambda p: p == pchannel, [pchannel])
    return owners[pchannel], bounds[pchannel]
