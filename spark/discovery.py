"""Finding the owner of each pchannel, and its retained bounds: the data source's adapters.

Three ways, one answer (a Snapshot: {pchannel: Owner}, and the names of every pchannel
that exists when the source can tell):
- `coord`: the first full assignment pushed by the coord's AssignmentDiscover stream, and
  its DescribeChannels for the names;
- `kubernetes`: the status of the PChannel resources (state Assigned, node.address, term),
  in-cluster or through a kubeconfig;
- `nodes`: CollectStatus of a fixed list of nodes (no coord; local set-ups and tests).

A pchannel that exists but has no serving owner (a failover) is waited for; one that
does not exist fails at once. Bounds (oldest retained offset, log end) always come from
the owner's CollectStatus, and only under the owner's term, so a stale owner's view is
never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.errors import ChannelNotExist, StreamingError, Unavailable
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import coord_pb2_grpc as cpbg
from streamwal.proto import streaming_pb2 as pb
from streamwal.spark.offsets import Bounds
from streamwal.spark.options import DiscoveryConfig
from streamwal.transport import make_channel

log = logging.getLogger("streamwal.spark.discovery")

_DISCOVER = "/milvus.proto.streaming.StreamingCoordAssignmentService/AssignmentDiscover"
CALL_TIMEOUT_S = 5.0
KUBE_GROUP, KUBE_VERSION, KUBE_PLURAL = "streamwal.io", "v1alpha1", "pchannels"
PHYSICAL_SHIFT = 18  # a time tick is (physical ms << 18) | logical counter


@dataclass(frozen=True)
class Owner:
    pchannel: str
    term: int
    address: str
    node_id: int = 0


@dataclass(frozen=True)
class Snapshot:
    """One look at the discovery source: who serves what, and the names of all pchannels
    there are when the source knows them (None when it cannot tell, e.g. a node of the
    `nodes` list did not answer)."""

    owners: dict[str, Owner]
    existing: frozenset[str] | None


# -- the three adapters -------------------------------------------------------------------


async def _from_coord(address: str) -> Snapshot:
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
        described = await cpbg.StreamingCoordChannelServiceStub(channel).DescribeChannels(
            cpb.DescribeChannelsRequest(), timeout=CALL_TIMEOUT_S
        )
    if resp is None or not hasattr(resp, "WhichOneof"):
        raise Unavailable(f"coord {address} closed AssignmentDiscover without an assignment")
    if resp.WhichOneof("response") != "full_assignment":
        raise Unavailable(f"coord {address} answered AssignmentDiscover without an assignment")
    owners = {}
    for a in resp.full_assignment.assignments:
        for ch in a.channels:
            owners[ch.name] = Owner(ch.name, ch.term, a.node.address, a.node.server_id)
    return Snapshot(owners, frozenset(d.channel_name for d in described.descriptions))


def owners_from_pchannel_objects(items: Iterable[dict]) -> Snapshot:
    """Owners from PChannel resources: only those Assigned with a node address."""
    owners, names = {}, set()
    for item in items:
        status = item.get("status") or {}
        node = status.get("node") or {}
        name = (item.get("metadata") or {}).get("name")
        if name:
            names.add(name)
        if status.get("state") != "Assigned" or not node.get("address") or not name:
            continue
        owners[name] = Owner(name, int(status.get("term") or 0), node["address"],
                             int(node.get("id") or 0))  # fmt: skip
    return Snapshot(owners, frozenset(names))


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


def _from_kubernetes(namespace: str, kubeconfig: str | None) -> Snapshot:
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


async def _from_nodes(addresses: Iterable[str]) -> Snapshot:
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
    # Only when every node answered is a pchannel none of them serves known not to exist.
    everyone = all(reply is not None for reply in replies)
    return Snapshot(owners, frozenset(owners) if everyone else None)


def discover(cfg: DiscoveryConfig) -> Snapshot:
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


def _where(cfg: DiscoveryConfig) -> str:
    if cfg.coord:
        return f"the coord at {cfg.coord}"
    if cfg.kube_namespace:
        return f"the PChannel resources of namespace {cfg.kube_namespace}"
    return f"the nodes {', '.join(cfg.nodes)}"


def locate(
    cfg: DiscoveryConfig, select: Callable[[str], bool], required: Iterable[str] = ()
) -> tuple[dict[str, Owner], dict[str, Bounds]]:
    """Owners and bounds of every selected pchannel whose owner answers.

    Retries (bounded by `cfg.timeout_s`) until every `required` pchannel is located, so a
    query waits out a failover instead of failing on it; raises ChannelNotExist at once
    for a required pchannel the source says does not exist, and Unavailable naming the
    pchannels still missing at the deadline.
    """
    required = set(required)
    deadline = time.monotonic() + cfg.timeout_s
    pause = 0.1
    while True:
        missing: set[str] = set(required)
        error = ""
        try:
            snapshot = discover(cfg)
            if snapshot.existing is not None and required - snapshot.existing:
                known = sorted(snapshot.existing)
                raise ChannelNotExist(
                    f"no such pchannel: {', '.join(sorted(required - snapshot.existing))} "
                    f"({_where(cfg)} know{'s' if cfg.coord else ''} "
                    f"{', '.join(known[:20]) or 'none'}{', ...' if len(known) > 20 else ''})"
                )
            owners = {p: o for p, o in snapshot.owners.items() if select(p)}
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


async def _first_at(owner: Owner, bounds: Bounds, millis: int, timeout_s: float) -> int | None:
    """The first offset of `owner`'s pchannel whose time tick is at or after `millis`."""
    if bounds.first >= bounds.next:
        return None
    client = NodeClient(owner.address)
    try:
        consumer = await client.consumer(
            owner.pchannel,
            owner.term,
            DeliverPolicy.all(),
            [DeliverFilter.time_tick_gte(millis << PHYSICAL_SHIFT)],
            time_ticks=True,  # a tick in the log places a time after the last message
            end_offset=bounds.next,
        )
        try:
            batch = await asyncio.wait_for(consumer.next_batch(), timeout_s)
        finally:
            with contextlib.suppress(StreamingError, TimeoutError):
                await consumer.close()
    finally:
        await client.close()
    return batch[0].offset if batch else None


def offsets_at_times(
    owners: Mapping[str, Owner],
    bounds: Mapping[str, Bounds],
    millis: Mapping[str, int],
    timeout_s: float,
) -> dict[str, int | None]:
    """{pchannel: the first offset at or after millis[pchannel], None if none yet}: what
    startingTimestamp / ...ByTimestamp resolve to (time ticks are hybrid timestamps). The
    owner scans its log for it, each pchannel within `timeout_s`."""

    async def all_of() -> list[int | None]:
        return await asyncio.gather(
            *(_first_at(owners[p], bounds[p], ms, timeout_s) for p, ms in millis.items())
        )

    try:
        found = asyncio.run(all_of()) if millis else []
    except StreamingError:
        raise
    except Exception as exc:  # grpc, network: one typed error for callers
        raise Unavailable(f"finding offsets by time failed: {exc}") from exc
    return dict(zip(millis, found, strict=True))
