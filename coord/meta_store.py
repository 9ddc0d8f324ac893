"""Where the coord persists pchannel meta: an async interface and a local directory store.

Every write is a compare-and-put on an opaque version string, so two writers can never
silently overwrite each other. The Kubernetes implementation (PChannel status guarded by
`resourceVersion`) plugs in behind the same interface. The local one is a journal in a
directory (coord/meta_journal.py: the file format, crash repair, compaction):

    DIR/LOCK          flock'ed by the one coord using the directory
    DIR/CURRENT       which journal generation is live
    DIR/journal.GEN   every ChannelRecord, the ClusterRecord and every BroadcastTask, with
                      its version: a snapshot, then one checksummed frame per batch

Puts made while a batch is on the disk go out together in the next one (one write and
one fdatasync), and each returns once its own batch is durable: a kill -9 loses no put
that returned. A journal that CURRENT names but that is gone stops the store from
opening (MissingRecords) unless the caller explicitly forgets what it held.

Directories of the earlier format (one file per record, ``channels/NAME.rec``, a
manifest listing them) are migrated once when opened, with the same checks as before
(a record the manifest lists but that is gone refuses to open), and logged.
"""

from __future__ import annotations

import abc
import asyncio
import fcntl
import logging
import os
import re
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from streamwal.coord import meta_journal as mj
from streamwal.errors import Code, InvalidArgument, StreamingError
from streamwal.files import fsync_dir
from streamwal.proto import broadcast_pb2 as bpb
from streamwal.proto import coord_pb2 as cpb

log = logging.getLogger("streamwal.coord.meta_store")

# The earlier one-file-per-record format, read once to migrate it.
_LEGACY_MAGIC = b"SWM1"
_LEGACY_HEADER = struct.Struct(">4sQI")
_LEGACY = ("manifest.rec", "cluster.rec", "channels", "broadcasts")
# The journal's key spaces.
CHANNEL, CLUSTER, BROADCAST = 1, 2, 3
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class VersionConflict(StreamingError):
    """A compare-and-put lost: someone else wrote the record since it was read."""


class MetaStoreBusy(StreamingError):
    """Another coord holds the meta store."""


class MetaStoreUnwritable(StreamingError):
    """A record could not be written (a full or read-only disk): nothing changed."""

    code = Code.STREAMING_CODE_INNER


class CorruptRecord(StreamingError):
    """A record or journal failed its checksum; the store refuses to guess."""


class MissingRecords(StreamingError):
    """Files the store had are gone; it refuses to open without them."""

    code = Code.STREAMING_CODE_DATA_LOSS

    def __init__(self, directory: Path, what: str, files: str, names: list[str]) -> None:
        super().__init__(
            f"the meta store {directory} lost {what}. Restore {files} from a backup, or "
            "start once with --forget-missing-meta to drop them for good"
        )
        self.names = names


def check_name(name: str) -> str:
    """Pchannel names become journal keys and Kubernetes object names: keep them plain."""
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


class _GroupCommit:
    """Puts made while a batch is on the disk go out together in the next one (one frame,
    one fdatasync); each writer returns once its own batch is durable. The coord writes
    a record per pchannel and step: 1,024 pchannels placed at once were 2,048 writes of
    two fsyncs each, one after another (issue 24)."""

    def __init__(self, journal: mj.Journal) -> None:
        self._journal = journal
        self._pending: list[tuple[mj.Entry, bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task | None = None
        self.flushes = 0

    async def write(self, entry: mj.Entry, encoded: bytes) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((entry, encoded, waiter))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="meta-store-commit")
        await waiter

    async def drain(self) -> None:
        """Wait for the batches already taken (close calls it before the file goes)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    def _take(self) -> list[tuple[mj.Entry, bytes, asyncio.Future[None]]]:
        """The next batch: what is pending, up to a frame's limit."""
        size = 0
        for count, (_, encoded, _) in enumerate(self._pending):
            size += len(encoded)
            if size > mj.MAX_FRAME and count:
                break
        else:
            count = len(self._pending)
        batch, self._pending = self._pending[:count], self._pending[count:]
        return batch

    async def _flush(self) -> None:
        while self._pending:
            batch = self._take()
            error: BaseException | None = None
            try:
                await asyncio.to_thread(self._journal.append, [(e, b) for e, b, _ in batch])
                self.flushes += 1
            except mj.JournalError as exc:
                what = "a record" if len(batch) == 1 else f"{len(batch)} records"
                error = MetaStoreUnwritable(f"cannot write {what}: {exc}")
            except Exception as exc:
                error = exc
            for _, _, waiter in batch:
                if waiter.done():
                    continue
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)


def _copy_task(task: bpb.BroadcastTask) -> bpb.BroadcastTask:
    out = bpb.BroadcastTask()
    out.CopyFrom(task)
    return out


class MemoryMetaStore(MetaStore):
    """The store's rules in memory: versions, compare-and-put, copies in and out.

    `LocalMetaStore` adds the journal (each put durable before it returns); the simulator
    and tests that need no disk use it as it is (a coord "crash" keeps it: every put that
    returned is there, as with the journal)."""

    def __init__(self) -> None:
        self._mutex = asyncio.Lock()  # the cluster record and broadcasts
        self._locks: dict[str, asyncio.Lock] = {}  # a pchannel's record: one put at a time
        self._channels: dict[str, tuple[cpb.ChannelRecord, int]] = {}
        self._cluster: tuple[cpb.ClusterRecord, int] | None = None
        self._broadcasts: dict[int, tuple[bpb.BroadcastTask, int]] = {}

    async def _persist(self, space: int, key: str, version: int, payload: bytes | None) -> None:
        """Make a put (`payload`: the serialized record) or a delete (None) durable before
        the store shows it; nothing to do in memory."""

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
        # Puts of different pchannels run together (the journal writes them in one
        # flush); two puts of one pchannel are ordered by its lock.
        async with self._locks.setdefault(name, asyncio.Lock()):
            found = self._channels.get(name)
            current = str(found[1]) if found else None
            if current != expected:
                raise VersionConflict(f"{name}: stored version {current}, expected {expected}")
            version = (found[1] if found else 0) + 1
            await self._persist(CHANNEL, name, version, record.SerializeToString())
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
            await self._persist(CLUSTER, "", version, record.SerializeToString())
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
            await self._persist(BROADCAST, str(bid), version, task.SerializeToString())
            self._broadcasts[bid] = (_copy_task(task), version)
            return StoredBroadcast(_copy_task(task), str(version))

    async def delete_broadcast(self, broadcast_id: int) -> None:
        async with self._mutex:
            if self._broadcasts.pop(broadcast_id, None) is not None:
                await self._persist(BROADCAST, str(broadcast_id), 0, None)


class LocalMetaStore(MemoryMetaStore):
    """A directory owned by one coord process (enforced with flock)."""

    def __init__(self, directory: str | os.PathLike[str], forget_missing: bool = False) -> None:
        super().__init__()
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise MetaStoreBusy(f"another coord is using the meta store {self.dir}") from None
        try:
            self._journal = self._open(forget_missing)
            self._load()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._commit = _GroupCommit(self._journal)

    def _open(self, forget_missing: bool) -> mj.Journal:
        legacy = [self.dir / name for name in _LEGACY if (self.dir / name).exists()]
        try:
            if legacy and not (self.dir / mj.CURRENT).exists():
                live = _read_legacy(self.dir, forget_missing)
                generation = max(mj.Journal.generations(self.dir), default=0) + 1
                journal = mj.Journal.start(self.dir, live, generation)
                log.warning(
                    "meta store migrated from one file per record to a journal",
                    extra={"meta_dir": str(self.dir), "records": len(live)},
                )
            else:
                journal = mj.Journal.open(self.dir, forget_missing)
        except mj.Missing as exc:
            what = f"its live journal {exc} (every record it held)"
            raise MissingRecords(self.dir, what, "it", []) from None
        except mj.Corrupt as exc:
            raise CorruptRecord(str(exc)) from None
        for path in legacy:  # migrated now, or before a crash that left them
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if legacy:
            fsync_dir(self.dir)
        return journal

    def _load(self) -> None:
        for entry in self._journal.entries():
            payload = entry.payload or b""
            try:
                if entry.space == CHANNEL:
                    record = cpb.ChannelRecord.FromString(payload)
                    self._channels[entry.key] = (record, entry.version)
                elif entry.space == CLUSTER:
                    self._cluster = (cpb.ClusterRecord.FromString(payload), entry.version)
                elif entry.space == BROADCAST:
                    task = bpb.BroadcastTask.FromString(payload)
                    self._broadcasts[int(entry.key)] = (task, entry.version)
                else:
                    raise CorruptRecord(f"{self.dir}: unknown record kind {entry.space}")
            except (DecodeError, ValueError) as exc:
                raise CorruptRecord(f"{self.dir}: record {entry.key!r}: {exc}") from None

    async def _persist(self, space: int, key: str, version: int, payload: bytes | None) -> None:
        entry = mj.Entry(space, key, version, payload)
        try:
            encoded = entry.encode()
        except mj.TooLarge as exc:
            raise InvalidArgument(str(exc)) from None
        await self._commit.write(entry, encoded)

    async def close(self) -> None:
        if self._lock_fd >= 0:
            await self._commit.drain()
            self._journal.close()
            os.close(self._lock_fd)
            self._lock_fd = -1


def _read_legacy(directory: Path, forget_missing: bool) -> dict[mj.Key, bytes]:
    """The records of a directory in the earlier format, as journal entries; the manifest
    check as that format made it (a listed pchannel record that is gone refuses)."""
    live: dict[mj.Key, bytes] = {}

    def add(space: int, key: str, version: int, payload: bytes) -> None:
        live[(space, key)] = mj.Entry(space, key, version, payload).encode()

    names: set[str] = set()
    for path in sorted((directory / "channels").glob("*.rec")):
        version, payload = _legacy_record(path)
        name = cpb.ChannelRecord.FromString(payload).meta.channel.name
        names.add(name)
        add(CHANNEL, name, version, payload)
    for path in sorted((directory / "broadcasts").glob("*.rec")):
        version, payload = _legacy_record(path)
        add(BROADCAST, str(bpb.BroadcastTask.FromString(payload).broadcast_id), version, payload)
    if (directory / "cluster.rec").exists():
        add(CLUSTER, "", *_legacy_record(directory / "cluster.rec"))
    manifest = directory / "manifest.rec"
    listed = (
        set(cpb.ChannelManifest.FromString(_legacy_record(manifest)[1]).names)
        if manifest.exists()
        else set()
    )
    missing = sorted(listed - names)
    if missing and not forget_missing:
        raise MissingRecords(
            directory,
            f"the records of {len(missing)} pchannel(s) it had: {', '.join(missing)}",
            "them (channels/NAME.rec)",
            missing,
        )
    if missing:
        log.error("pchannel records forgotten for good", extra={"pchannels": missing})
    return live


def _legacy_record(path: Path) -> tuple[int, bytes]:
    data = path.read_bytes()
    if len(data) < _LEGACY_HEADER.size:
        raise CorruptRecord(f"{path}: truncated record")
    magic, version, crc = _LEGACY_HEADER.unpack_from(data)
    payload = data[_LEGACY_HEADER.size :]
    if magic != _LEGACY_MAGIC or zlib.crc32(payload) != crc:
        raise CorruptRecord(f"{path}: bad magic or checksum")
    return version, payload
