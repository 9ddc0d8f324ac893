"""Where the coord persists pchannel meta: an async interface and a local directory store.

Every write is a compare-and-put on an opaque version string, so two writers can never
silently overwrite each other. The Kubernetes implementation (PChannel status guarded by
`resourceVersion`) plugs in behind the same interface; the local one keeps one file per
pchannel in a directory:

    DIR/LOCK                 flock'ed by the one coord using the directory
    DIR/manifest.rec         the name of every pchannel record ever written (ChannelManifest)
    DIR/cluster.rec          ClusterRecord (incarnation, drained nodes)
    DIR/channels/NAME.rec    ChannelRecord (the seed's PChannelMeta, owner, tombstone)
    DIR/broadcasts/ID.rec    BroadcastTask (a broadcast's message, targets and progress)

A record file is ``b"SWM1" | version (u64 BE) | crc32 (u32 BE) | protobuf``, written to a
temporary file, fsync'ed, renamed over the old one and the directory fsync'ed: after a
kill -9 a file holds either the old or the new record, never a torn one.

A checksum finds a damaged record but not a missing one: a deleted record file would
make its pchannel vanish without a word. The manifest lists every pchannel record (a new
record is written first, then the manifest that names it, so a crash in between leaves
an unlisted record, which is adopted, never a listed one that is missing); a listed
record that is gone stops the store from opening (MissingRecords), unless the caller
explicitly forgets those pchannels.
"""

from __future__ import annotations

import abc
import asyncio
import ctypes
import fcntl
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamwal.errors import Code, InvalidArgument, StreamingError
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import coord_pb2 as cpb

log = logging.getLogger("streamwal.coord.meta_store")

_MAGIC = b"SWM1"
_HEADER = struct.Struct(">4sQI")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class VersionConflict(StreamingError):
    """A compare-and-put lost: someone else wrote the record since it was read."""


class MetaStoreBusy(StreamingError):
    """Another coord holds the meta store."""


class MetaStoreUnwritable(StreamingError):
    """A record could not be written (a full or read-only disk): nothing changed."""

    code = Code.STREAMING_CODE_INNER


class CorruptRecord(StreamingError):
    """A record file failed its checksum; the store refuses to guess."""


class MissingRecords(StreamingError):
    """Records the manifest lists are gone; the store refuses to open without them."""

    code = Code.STREAMING_CODE_DATA_LOSS

    def __init__(self, directory: Path, names: list[str]) -> None:
        super().__init__(
            f"the meta store {directory} lost the records of {len(names)} pchannel(s) it "
            f"had: {', '.join(names)}. Restore them (channels/NAME.rec) from a backup, or "
            "start once with --forget-missing-meta to drop them for good"
        )
        self.names = names


def check_name(name: str) -> str:
    """Pchannel names become file names and Kubernetes object names: keep them plain."""
    if not _NAME.match(name):
        raise InvalidArgument(
            f"invalid pchannel name {name!r}: use letters, digits, '_', '.', '-' (max 200)"
        )
    return name


@dataclass(frozen=True)
class Stored:
    """A record with the version it was read at (pass it back to `put_channel`)."""

    record: cpb.ChannelRecord
    version: str

    @property
    def name(self) -> str:
        return self.record.meta.channel.name


@dataclass(frozen=True)
class StoredBroadcast:
    """A broadcast task with the version it was read at (pass it back to `put_broadcast`)."""

    task: bpb.BroadcastTask
    version: str


class MetaStore(abc.ABC):
    """Persistent pchannel records with optimistic concurrency."""

    @abc.abstractmethod
    async def list_channels(self) -> list[Stored]:
        """Every record, tombstones included, sorted by name."""

    @abc.abstractmethod
    async def get_channel(self, name: str) -> Stored | None: ...

    @abc.abstractmethod
    async def put_channel(self, record: cpb.ChannelRecord, expected: str | None) -> Stored:
        """Write `record` if its stored version is `expected` (None: it must not exist yet).

        Durable when it returns; raises VersionConflict otherwise.
        """

    @abc.abstractmethod
    async def get_cluster(self) -> tuple[cpb.ClusterRecord, str | None]: ...

    @abc.abstractmethod
    async def put_cluster(self, record: cpb.ClusterRecord, expected: str | None) -> str: ...

    # Broadcast tasks (coord/broadcaster.py).
    @abc.abstractmethod
    async def list_broadcasts(self) -> list[StoredBroadcast]:
        """Every broadcast task, sorted by id."""

    @abc.abstractmethod
    async def put_broadcast(self, task: bpb.BroadcastTask, expected: str | None) -> StoredBroadcast:
        """Compare-and-put of a task (None: it must not exist yet); durable when it returns."""

    @abc.abstractmethod
    async def delete_broadcast(self, broadcast_id: int) -> None:
        """Forget a task (an expired tombstone); a task that is gone already is no error."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the store holds."""


def _encode(version: int, payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, version, zlib.crc32(payload)) + payload


def _decode(path: Path, data: bytes) -> tuple[int, bytes]:
    if len(data) < _HEADER.size:
        raise CorruptRecord(f"{path}: truncated record")
    magic, version, crc = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or zlib.crc32(payload) != crc:
        raise CorruptRecord(f"{path}: bad magic or checksum")
    return version, payload


def _write_all(batch: dict[Path, bytes]) -> None:
    """Write every file of `batch` atomically and durably with one flush for them all: the
    temporary files, one syncfs (or an fsync each where there is none), the renames, one
    fsync per folder. A burst of N records costs about two flushes, not 2 N."""
    tmps: list[tuple[Path, Path]] = []
    try:
        for path, data in batch.items():
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                if _SYNCFS is None or len(batch) == 1:
                    os.fsync(fd)
            finally:
                os.close(fd)
            tmps.append((tmp, path))
        if _SYNCFS is not None and len(batch) > 1:
            folder = os.open(next(iter(batch)).parent, os.O_RDONLY)
            try:
                if _SYNCFS(folder) != 0:
                    raise OSError(ctypes.get_errno(), "syncfs failed")
            finally:
                os.close(folder)
        for tmp, path in tmps:
            os.replace(tmp, path)
        for folder_path in {path.parent for path in batch}:
            _fsync_dir(folder_path)
    except OSError as exc:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        what = str(next(iter(batch))) if len(batch) == 1 else f"{len(batch)} records"
        raise MetaStoreUnwritable(f"cannot write {what}: {exc.strerror or exc}") from None


def _syncfs():
    """glibc's syncfs(2) (Linux): flushes the file system of one folder, once per batch."""
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _syncfs()


class _GroupCommit:
    """Record writes made while a flush is on the disk go out together in the next one
    (`_write_all`); each writer returns once its own record is durable. The coord writes
    a record per pchannel and step: 1,024 pchannels placed at once were 2,048 writes of
    two fsyncs each, one after another (issue 24)."""

    def __init__(self, after: Callable[[list[Path]], None]) -> None:
        self._after = after  # in the flush thread, once the batch is durable
        self._pending: dict[Path, bytes] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task | None = None
        self.flushes = 0

    async def write(self, path: Path, data: bytes) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[path] = data
        self._waiters.append(waiter)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="meta-store-commit")
        await waiter

    def _write(self, batch: dict[Path, bytes]) -> None:
        _write_all(batch)
        self._after(list(batch))

    async def _flush(self) -> None:
        while self._pending:
            batch, waiters = self._pending, self._waiters
            self._pending, self._waiters = {}, []
            error: BaseException | None = None
            try:
                await asyncio.to_thread(self._write, batch)
                self.flushes += 1
            except Exception as exc:
                error = exc
            for waiter in waiters:
                if waiter.done():
                    continue
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _unlink_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _copy_task(task: bpb.BroadcastTask) -> bpb.BroadcastTask:
    out = bpb.BroadcastTask()
    out.CopyFrom(task)
    return out


class MemoryMetaStore(MetaStore):
    """The store's rules in memory: versions, compare-and-put, copies in and out.

    `LocalMetaStore` adds the files (each put durable before it returns); the simulator
    and tests that need no disk use it as it is (a coord "crash" keeps it: every put that
    returned is there, as with the files)."""

    def __init__(self) -> None:
        self._mutex = asyncio.Lock()  # the cluster record and broadcasts
        self._locks: dict[str, asyncio.Lock] = {}  # a pchannel's record: one put at a time
        self._channels: dict[str, tuple[cpb.ChannelRecord, int]] = {}
        self._cluster: tuple[cpb.ClusterRecord, int] | None = None
        self._broadcasts: dict[int, tuple[bpb.BroadcastTask, int]] = {}

    async def _persist(self, kind: str, key: str, data: bytes | None) -> None:
        """Make a put (`data`: the encoded record) or a delete (None) durable before the
        store shows it; nothing to do in memory."""

    @staticmethod
    def _copy(record: cpb.ChannelRecord) -> cpb.ChannelRecord:
        out = cpb.ChannelRecord()
        out.CopyFrom(record)
        return out

    async def list_channels(self) -> list[Stored]:
        return [
            Stored(self._copy(rec), str(ver)) for _, (rec, ver) in sorted(self._channels.items())
        ]

    async def get_channel(self, name: str) -> Stored | None:
        found = self._channels.get(name)
        return Stored(self._copy(found[0]), str(found[1])) if found else None

    async def put_channel(self, record: cpb.ChannelRecord, expected: str | None) -> Stored:
        name = check_name(record.meta.channel.name)
        # Puts of different pchannels run together (the file store writes them in one
        # flush); two puts of one pchannel are ordered by its lock.
        async with self._locks.setdefault(name, asyncio.Lock()):
            found = self._channels.get(name)
            current = str(found[1]) if found else None
            if current != expected:
                raise VersionConflict(f"{name}: stored version {current}, expected {expected}")
            version = (found[1] if found else 0) + 1
            await self._persist("channels", name, _encode(version, record.SerializeToString()))
            self._channels[name] = (self._copy(record), version)
            return Stored(self._copy(record), str(version))

    async def get_cluster(self) -> tuple[cpb.ClusterRecord, str | None]:
        if self._cluster is None:
            return cpb.ClusterRecord(), None
        out = cpb.ClusterRecord()
        out.CopyFrom(self._cluster[0])
        return out, str(self._cluster[1])

    async def put_cluster(self, record: cpb.ClusterRecord, expected: str | None) -> str:
        async with self._mutex:
            current = str(self._cluster[1]) if self._cluster else None
            if current != expected:
                raise VersionConflict(f"cluster: stored version {current}, expected {expected}")
            version = (self._cluster[1] if self._cluster else 0) + 1
            await self._persist("", "cluster", _encode(version, record.SerializeToString()))
            copy = cpb.ClusterRecord()
            copy.CopyFrom(record)
            self._cluster = (copy, version)
            return str(version)

    async def list_broadcasts(self) -> list[StoredBroadcast]:
        return [
            StoredBroadcast(_copy_task(task), str(version))
            for _, (task, version) in sorted(self._broadcasts.items())
        ]

    async def put_broadcast(self, task: bpb.BroadcastTask, expected: str | None) -> StoredBroadcast:
        bid = task.broadcast_id
        if bid <= 0:
            raise InvalidArgument(f"broadcast id must be positive, got {bid}")
        async with self._mutex:
            found = self._broadcasts.get(bid)
            current = str(found[1]) if found else None
            if current != expected:
                raise VersionConflict(
                    f"broadcast {bid}: stored version {current}, expected {expected}"
                )
            version = (found[1] if found else 0) + 1
            await self._persist("broadcasts", str(bid), _encode(version, task.SerializeToString()))
            self._broadcasts[bid] = (_copy_task(task), version)
            return StoredBroadcast(_copy_task(task), str(version))

    async def delete_broadcast(self, broadcast_id: int) -> None:
        async with self._mutex:
            if self._broadcasts.pop(broadcast_id, None) is not None:
                await self._persist("broadcasts", str(broadcast_id), None)


class LocalMetaStore(MemoryMetaStore):
    """A directory owned by one coord process (enforced with flock)."""

    def __init__(self, directory: str | os.PathLike[str], forget_missing: bool = False) -> None:
        super().__init__()
        self.dir = Path(directory)
        self._forget_missing = forget_missing
        self._channels_dir = self.dir / "channels"
        self._channels_dir.mkdir(parents=True, exist_ok=True)
        self._broadcasts_dir = self.dir / "broadcasts"
        self._broadcasts_dir.mkdir(exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise MetaStoreBusy(f"another coord is using the meta store {self.dir}") from None
        self._manifest: set[str] = set()
        self._manifest_version = 0
        self._commit = _GroupCommit(self._list_new)
        try:
            self._load()
        except StreamingError:
            os.close(self._lock_fd)
            raise

    def _load(self) -> None:
        for stale in self._channels_dir.glob(".*.tmp"):
            stale.unlink()
        for path in self._channels_dir.glob("*.rec"):
            version, payload = _decode(path, path.read_bytes())
            record = cpb.ChannelRecord.FromString(payload)
            self._channels[record.meta.channel.name] = (record, version)
        for stale in self._broadcasts_dir.glob(".*.tmp"):
            stale.unlink()
        for path in self._broadcasts_dir.glob("*.rec"):
            version, payload = _decode(path, path.read_bytes())
            task = bpb.BroadcastTask.FromString(payload)
            self._broadcasts[task.broadcast_id] = (task, version)
        cluster = self.dir / "cluster.rec"
        if cluster.exists():
            version, payload = _decode(cluster, cluster.read_bytes())
            self._cluster = (cpb.ClusterRecord.FromString(payload), version)
        self._check_manifest()

    def _check_manifest(self) -> None:
        path = self.dir / "manifest.rec"
        if path.exists():
            self._manifest_version, payload = _decode(path, path.read_bytes())
            self._manifest = set(cpb.ChannelManifest.FromString(payload).names)
        elif self._channels:
            log.warning("meta store without a manifest: starting one from its records")
        missing = sorted(self._manifest - set(self._channels))
        if missing and not self._forget_missing:
            raise MissingRecords(self.dir, missing)
        if missing:
            log.error("pchannel records forgotten for good", extra={"pchannels": missing})
        if missing or set(self._channels) - self._manifest:
            self._manifest = set(self._channels)
            self._write_manifest()

    def _write_manifest(self) -> None:
        self._manifest_version += 1
        payload = cpb.ChannelManifest(names=sorted(self._manifest)).SerializeToString()
        _write_all({self.dir / "manifest.rec": _encode(self._manifest_version, payload)})

    async def _persist(self, kind: str, key: str, data: bytes | None) -> None:
        path = (self.dir / kind if kind else self.dir) / f"{key}.rec"
        if data is None:
            await asyncio.to_thread(_unlink_durably, path)
        else:
            await self._commit.write(path, data)

    def _list_new(self, paths: list[Path]) -> None:
        """After a batch is durable: list its new pchannels in the manifest (after the
        records: it never lists a missing one), one write for the batch."""
        new = {p.stem for p in paths if p.parent == self._channels_dir} - self._manifest
        if new:
            self._manifest |= new
            self._write_manifest()

    async def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
