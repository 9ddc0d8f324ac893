"""A FUSE file system that loses what was not synced when told the power went out.

After Jepsen's lazyfs: every write is kept in memory until the file is fsync'ed or
fdatasync'ed; a "power loss" drops everything not yet synced. Run as its own process:

    python tests/nemesis/lazyfs.py BACKING MOUNTPOINT CONTROL_SOCKET

and send one JSON line per request to the Unix socket CONTROL_SOCKET; each gets one JSON
line back: ``{"op": "power_loss", "keep": 0.0, "seed": 1}`` (drop what is unsynced),
``{"op": "unsynced"}`` (what a power loss would drop now), ``{"op": "stall_syncs",
"seconds": 2.5}`` (every fsync until then returns only then: a stalled disk, as this
VM's at times), ``{"op": "ping"}``.
`tests/nemesis/faults.py` (`LazyMount`) starts, drives and unmounts it.

What "synced" means, the strictest reading of POSIX (fsync(2): "Calling fsync() does not
necessarily ensure that the entry in the directory containing the file has also reached
disk. For that an explicit fsync() on a file descriptor for the directory is also
needed"):

- A file's *contents and size* are durable up to its last fsync/fdatasync (both commit
  the size: fdatasync must persist what a later read needs). Truncations count as writes.
- A directory's *entries* (name -> file) are durable as of its last fsync. create, mkdir,
  unlink, rmdir, rename and link change a directory only until a power loss, unless that
  directory is fsync'ed after them: a created file whose directory was never synced is
  gone after a power loss (even if the file itself was fsync'ed), an unsynced rename is
  undone (both names back, as of the last sync of each directory), an unsynced unlink
  brings the file back with its synced contents. A rename across directories is durable
  in each directory separately.
- Power loss resets every directory to its durable entries (from the root), every file
  reachable that way to its synced contents, and forgets everything else, open files
  included (their handles answer ESTALE). With ``keep`` > 0, each unsynced page inside a
  file's synced size is written to it with that probability (seeded): torn overwrites, as
  when writeback had flushed some pages (RocksDB recycles WAL files, so its appends are
  overwrites). Pages beyond the synced size are always lost.

Not modelled: background writeback of the page cache (a real kernel flushes dirty pages
after ~30 s; here nothing unsynced ever becomes durable by itself, the worst case), lost
or reordered *synced* writes (a lying disk), file attributes (mode and times survive as
they are). The file system starts empty; synced contents live in BACKING (one file per
inode), the unsynced ones in this process's memory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096
ROOT = 1  # pyfuse3.ROOT_INODE


class FsError(OSError):
    """An errno for the caller (the FUSE glue turns it into a FUSEError)."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


@dataclass
class Inode:
    ino: int
    is_dir: bool
    mode: int
    uid: int = 0
    gid: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)
    ctime_ns: int = field(default_factory=time.time_ns)
    # a file: the current size, the backing file's bytes that are still part of the
    # current contents (a truncation shortens it), unsynced pages (page number -> PAGE
    # bytes as the file holds them now)
    size: int = 0
    backing_valid: int = 0
    pages: dict[int, bytearray] = field(default_factory=dict)
    # a directory: name -> inode now, and as of its last fsync
    entries: dict[bytes, int] = field(default_factory=dict)
    durable: dict[bytes, int] = field(default_factory=dict)


class LazyState:
    """The file system's contents, without FUSE: every operation is synchronous."""

    def __init__(self, backing: Path, uid: int = 0, gid: int = 0) -> None:
        self.backing = backing
        self.backing.mkdir(parents=True, exist_ok=True)
        self.inodes: dict[int, Inode] = {ROOT: Inode(ROOT, True, stat.S_IFDIR | 0o755, uid, gid)}
        self._fds: dict[int, int] = {}
        self._next = ROOT + 1

    # ----------------------------------------------------------------- namespace

    def get(self, ino: int) -> Inode:
        inode = self.inodes.get(ino)
        if inode is None:
            raise FsError(errno.ESTALE)
        return inode

    def _dir(self, ino: int) -> Inode:
        inode = self.get(ino)
        if not inode.is_dir:
            raise FsError(errno.ENOTDIR)
        return inode

    def lookup(self, parent: int, name: bytes) -> Inode:
        ino = self._dir(parent).entries.get(name)
        if ino is None:
            raise FsError(errno.ENOENT)
        return self.get(ino)

    def create(self, parent: int, name: bytes, mode: int, uid: int = 0, gid: int = 0) -> Inode:
        """A new file or directory (by `mode`) at `name` in `parent`."""
        directory = self._dir(parent)
        if name in directory.entries:
            raise FsError(errno.EEXIST)
        inode = Inode(self._next, stat.S_ISDIR(mode), mode, uid, gid)
        self._next += 1
        self.inodes[inode.ino] = inode
        if not inode.is_dir:
            self._fds[inode.ino] = os.open(
                self.backing / f"ino-{inode.ino}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600
            )
        directory.entries[name] = inode.ino
        directory.mtime_ns = time.time_ns()
        return inode

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        inode = self.get(ino)
        directory = self._dir(parent)
        if inode.is_dir:
            raise FsError(errno.EPERM)
        if name in directory.entries:
            raise FsError(errno.EEXIST)
        directory.entries[name] = ino
        inode.ctime_ns = time.time_ns()
        return inode

    def unlink(self, parent: int, name: bytes) -> None:
        inode = self.lookup(parent, name)
        if inode.is_dir:
            raise FsError(errno.EISDIR)
        del self.inodes[parent].entries[name]

    def rmdir(self, parent: int, name: bytes) -> None:
        inode = self.lookup(parent, name)
        if not inode.is_dir:
            raise FsError(errno.ENOTDIR)
        if inode.entries:
            raise FsError(errno.ENOTEMPTY)
        del self.inodes[parent].entries[name]

    def rename(
        self, old_parent: int, old: bytes, new_parent: int, new: bytes, noreplace: bool = False
    ) -> None:
        moved = self.lookup(old_parent, old)
        target_dir = self._dir(new_parent)
        replaced = target_dir.entries.get(new)
        if replaced is not None:
            if noreplace:
                raise FsError(errno.EEXIST)
            victim = self.get(replaced)
            if victim.is_dir != moved.is_dir:
                raise FsError(errno.EISDIR if victim.is_dir else errno.ENOTDIR)
            if victim.is_dir and victim.entries:
                raise FsError(errno.ENOTEMPTY)
        del self.inodes[old_parent].entries[old]
        target_dir.entries[new] = moved.ino
        moved.ctime_ns = time.time_ns()

    def sync_dir(self, ino: int) -> None:
        directory = self._dir(ino)
        directory.durable = dict(directory.entries)

    def nlink(self, inode: Inode) -> int:
        if inode.is_dir:
            return 2
        dirs = (d for d in self.inodes.values() if d.is_dir)
        return sum(1 for d in dirs for i in d.entries.values() if i == inode.ino)

    # ----------------------------------------------------------------- contents

    def _file(self, ino: int) -> Inode:
        inode = self.get(ino)
        if inode.is_dir:
            raise FsError(errno.EISDIR)
        return inode

    def _synced_bytes(self, inode: Inode, offset: int, size: int) -> bytearray:
        """The backing file's bytes that still belong to the file, zeros elsewhere."""
        out = bytearray(size)
        valid = max(0, min(size, inode.backing_valid - offset))
        if valid:
            data = os.pread(self._fds[inode.ino], valid, offset)
            out[: len(data)] = data
        return out

    def read(self, ino: int, offset: int, size: int) -> bytes:
        inode = self._file(ino)
        size = max(0, min(size, inode.size - offset))
        if not size:
            return b""
        out = self._synced_bytes(inode, offset, size)
        for number in range(offset // PAGE, (offset + size - 1) // PAGE + 1):
            page = inode.pages.get(number)
            if page is None:
                continue
            start = max(offset, number * PAGE)
            end = min(offset + size, (number + 1) * PAGE)
            out[start - offset : end - offset] = page[start - number * PAGE : end - number * PAGE]
        return bytes(out)

    def write(self, ino: int, offset: int, data: bytes) -> int:
        inode = self._file(ino)
        if not data:
            return 0
        end = offset + len(data)
        for number in range(offset // PAGE, (end - 1) // PAGE + 1):
            base = number * PAGE
            page = inode.pages.get(number)
            if page is None:  # zeros past the synced bytes: backing_valid <= size
                page = inode.pages[number] = self._synced_bytes(inode, base, PAGE)
            start = max(offset, base)
            stop = min(end, base + PAGE)
            page[start - base : stop - base] = data[start - offset : stop - offset]
        inode.size = max(inode.size, end)
        inode.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, ino: int, size: int) -> None:
        inode = self._file(ino)
        if size < inode.size:
            inode.backing_valid = min(inode.backing_valid, size)
            for number in [n for n in inode.pages if n * PAGE >= size]:
                del inode.pages[number]
            page = inode.pages.get(size // PAGE)
            if page is not None:
                page[size % PAGE :] = bytes(PAGE - size % PAGE)
        inode.size = size
        inode.mtime_ns = time.time_ns()

    def sync_file(self, ino: int) -> None:
        """fsync and fdatasync: contents and size are durable."""
        inode = self._file(ino)
        fd = self._fds[ino]
        os.ftruncate(fd, inode.backing_valid)  # what a truncation cut stays cut
        for number, page in sorted(inode.pages.items()):
            os.pwrite(fd, page[: min(PAGE, inode.size - number * PAGE)], number * PAGE)
        os.ftruncate(fd, inode.size)
        inode.pages.clear()
        inode.backing_valid = inode.size

    # ----------------------------------------------------------------- crashes

    def unsynced(self) -> dict:
        """What a power loss would drop now: unsynced bytes per file, changed entries."""
        files = {}
        for path, inode in self._paths(lambda d: d.entries):
            if not inode.is_dir and (inode.pages or inode.size != self._synced_size(inode)):
                files[path] = len(inode.pages) * PAGE
        entries = sum(
            len(set(d.entries.items()) ^ set(d.durable.items()))
            for d in self.inodes.values()
            if d.is_dir
        )
        return {"files": files, "entries": entries}

    def power_loss(self, keep: float = 0.0, seed: int = 0) -> dict:
        """Back to the durable state; returns what was dropped."""
        report = self.unsynced()
        rng = random.Random(seed)
        kept = 0
        reachable = self._reachable([ROOT], lambda d: d.durable)
        for ino in sorted(reachable):
            inode = self.inodes[ino]
            if inode.is_dir:
                inode.entries = dict(inode.durable)
                continue
            synced = self._synced_size(inode)
            for number, page in sorted(inode.pages.items()):
                base = number * PAGE
                if base < synced and rng.random() < keep:
                    os.pwrite(self._fds[ino], page[: min(PAGE, synced - base)], base)
                    kept += 1
            inode.pages.clear()
            inode.size = inode.backing_valid = synced
        self._drop(set(self.inodes) - reachable)
        report["kept_pages"] = kept
        return report

    def collect(self, roots: Iterable[int]) -> None:
        """Forgets the inodes that neither an entry (current or durable: a power loss
        would bring it back) nor a root (open, known to the kernel) leads to."""
        both = lambda d: {**d.durable, **d.entries}  # noqa: E731
        self._drop(set(self.inodes) - self._reachable({ROOT, *roots}, both))

    def _synced_size(self, inode: Inode) -> int:
        return os.fstat(self._fds[inode.ino]).st_size

    def _reachable(self, roots: Iterable[int], edges) -> set[int]:
        seen: set[int] = set()
        todo = [r for r in roots if r in self.inodes]
        while todo:
            ino = todo.pop()
            if ino in seen:
                continue
            seen.add(ino)
            inode = self.inodes[ino]
            if inode.is_dir:
                todo.extend(i for i in edges(inode).values() if i in self.inodes)
        return seen

    def _paths(self, edges) -> list[tuple[str, Inode]]:
        out: list[tuple[str, Inode]] = []
        todo: list[tuple[str, int]] = [("", ROOT)]
        seen: set[int] = set()
        while todo:
            path, ino = todo.pop()
            if ino in seen:
                continue
            seen.add(ino)
            inode = self.inodes[ino]
            out.append((path or "/", inode))
            if inode.is_dir:
                for name, child in edges(inode).items():
                    if child in self.inodes:
                        todo.append((f"{path}/{name.decode(errors='replace')}", child))
        return out

    def _drop(self, inos: Iterable[int]) -> None:
        for ino in inos:
            if ino == ROOT:
                continue
            del self.inodes[ino]
            fd = self._fds.pop(ino, None)
            if fd is not None:
                os.close(fd)
                (self.backing / f"ino-{ino}").unlink(missing_ok=True)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# --------------------------------------------------------------------- the FUSE glue


def serve(backing: Path, mountpoint: Path, control: Path) -> None:
    """Mount, answer FUSE and control requests until unmounted or SIGTERM'ed."""
    import pyfuse3
    import trio

    state = LazyState(backing, os.getuid(), os.getgid())

    def fuse_errors(fn):
        async def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except FsError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None

        wrapper.__name__ = fn.__name__
        return wrapper

    class Ops(pyfuse3.Operations):
        enable_writeback_cache = False  # every write and fsync reaches this process

        def __init__(self) -> None:
            super().__init__()
            self.handles: dict[int, int] = {}  # fh -> inode (files and directories)
            self.listings: dict[int, list[tuple[bytes, int]]] = {}
            self.lookups: dict[int, int] = {}
            self._next_fh = 1

        def attrs(self, inode: Inode) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            a.st_ino = inode.ino
            a.generation = 0
            a.entry_timeout = 0  # the kernel asks again: names change under it at a power loss
            a.attr_timeout = 0
            a.st_mode = inode.mode
            a.st_nlink = state.nlink(inode)
            a.st_uid, a.st_gid = inode.uid, inode.gid
            a.st_rdev = 0
            a.st_size = 0 if inode.is_dir else inode.size
            a.st_blksize = PAGE
            a.st_blocks = (a.st_size + 511) // 512
            a.st_atime_ns = a.st_mtime_ns = inode.mtime_ns
            a.st_ctime_ns = inode.ctime_ns
            return a

        def _found(self, inode: Inode) -> pyfuse3.EntryAttributes:
            self.lookups[inode.ino] = self.lookups.get(inode.ino, 0) + 1
            return self.attrs(inode)

        def _open(self, ino: int) -> int:
            fh = self._next_fh
            self._next_fh += 1
            self.handles[fh] = ino
            return fh

        def _ino(self, fh: int) -> int:
            ino = self.handles.get(fh)
            if ino is None:  # opened before a power loss
                raise FsError(errno.ESTALE)
            return ino

        def _collect(self) -> None:
            state.collect([*self.handles.values(), *self.lookups])

        @fuse_errors
        def lookup(self, parent_inode, name, ctx=None):
            if name == b".":
                return self._found(state.get(parent_inode))
            return self._found(state.lookup(parent_inode, name))

        @fuse_errors
        def getattr(self, inode, ctx=None):
            return self.attrs(state.get(inode))

        @fuse_errors
        def setattr(self, inode, attr, fields, fh, ctx):
            node = state.get(inode)
            if fields.update_size:
                state.truncate(inode, attr.st_size)
            if fields.update_mode:
                node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
            if fields.update_uid:
                node.uid = attr.st_uid
            if fields.update_gid:
                node.gid = attr.st_gid
            if fields.update_mtime:
                node.mtime_ns = attr.st_mtime_ns
            node.ctime_ns = time.time_ns()
            return self.attrs(node)

        async def forget(self, inode_list):
            for ino, count in inode_list:
                left = self.lookups.get(ino, 0) - count
                if left > 0:
                    self.lookups[ino] = left
                else:
                    self.lookups.pop(ino, None)
            self._collect()

        @fuse_errors
        def opendir(self, inode, ctx):
            directory = state.get(inode)
            if not directory.is_dir:
                raise FsError(errno.ENOTDIR)
            fh = self._open(inode)
            self.listings[fh] = sorted(directory.entries.items())
            return fh

        async def readdir(self, fh, start_id, token):
            listing = self.listings.get(fh, [])
            for index in range(start_id, len(listing)):
                name, ino = listing[index]
                if ino not in state.inodes:
                    continue
                attrs = self._found(state.inodes[ino])
                if not pyfuse3.readdir_reply(token, name, attrs, index + 1):
                    self.lookups[ino] -= 1
                    break

        def _close(self, fh: int) -> None:
            self.handles.pop(fh, None)
            self.listings.pop(fh, None)
            self._collect()

        @fuse_errors
        def releasedir(self, fh):
            self._close(fh)

        @fuse_errors
        def fsyncdir(self, fh, datasync):
            state.sync_dir(self._ino(fh))

        @fuse_errors
        def mkdir(self, parent_inode, name, mode, ctx):
            return self._found(
                state.create(parent_inode, name, stat.S_IFDIR | mode, ctx.uid, ctx.gid)
            )

        @fuse_errors
        def rmdir(self, parent_inode, name, ctx):
            state.rmdir(parent_inode, name)
            self._collect()

        @fuse_errors
        def unlink(self, parent_inode, name, ctx):
            state.unlink(parent_inode, name)
            self._collect()

        @fuse_errors
        def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
            if flags & pyfuse3.RENAME_EXCHANGE:
                raise FsError(errno.EINVAL)
            noreplace = bool(flags & pyfuse3.RENAME_NOREPLACE)
            state.rename(parent_inode_old, name_old, parent_inode_new, name_new, noreplace)
            self._collect()

        @fuse_errors
        def link(self, inode, new_parent_inode, new_name, ctx):
            return self._found(state.link(inode, new_parent_inode, new_name))

        @fuse_errors
        def open(self, inode, flags, ctx):
            if state.get(inode).is_dir:
                raise FsError(errno.EISDIR)
            if flags & os.O_TRUNC:
                state.truncate(inode, 0)
            return pyfuse3.FileInfo(fh=self._open(inode))  # no keep_cache: a reopen rereads

        @fuse_errors
        def create(self, parent_inode, name, mode, flags, ctx):
            mode = stat.S_IFREG | stat.S_IMODE(mode)
            inode = state.create(parent_inode, name, mode, ctx.uid, ctx.gid)
            return pyfuse3.FileInfo(fh=self._open(inode.ino)), self._found(inode)

        @fuse_errors
        def read(self, fh, off, size):
            return state.read(self._ino(fh), off, size)

        @fuse_errors
        def write(self, fh, off, buf):
            return state.write(self._ino(fh), off, buf)

        @fuse_errors
        def flush(self, fh):
            self._ino(fh)

        @fuse_errors
        def release(self, fh):
            self._close(fh)

        async def fsync(self, fh, datasync):
            wait = stalled_until - trio.current_time()
            if wait > 0:  # a stalled disk: the sync returns when the stall ends
                await trio.sleep(wait)
            try:
                state.sync_file(self._ino(fh))
            except FsError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None

        @fuse_errors
        def statfs(self, ctx):
            real = os.statvfs(backing)
            s = pyfuse3.StatvfsData()
            for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
                setattr(s, name, getattr(real, name))
            for name in ("f_files", "f_ffree", "f_favail"):
                setattr(s, name, getattr(real, name))
            s.f_namemax = 255
            return s

    ops = Ops()
    stalled_until = 0.0  # trio time before which every fsync waits (`stall_syncs`)

    def command(request: dict) -> dict:
        nonlocal stalled_until
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "stall_syncs":
            stalled_until = trio.current_time() + float(request["seconds"])
            return {"ok": True}
        if op == "unsynced":
            return {"ok": True, **state.unsynced()}
        if op == "power_loss":
            report = state.power_loss(float(request.get("keep", 0.0)), int(request.get("seed", 0)))
            ops.handles.clear()
            ops.listings.clear()
            for ino in list(ops.lookups):
                with contextlib.suppress(OSError):  # the kernel no longer knows it
                    pyfuse3.invalidate_inode(ino)
            return {"ok": True, **report}
        return {"ok": False, "error": f"unknown op {op!r}"}

    async def client(conn) -> None:
        async with trio.SocketStream(conn) as stream:
            buffer = b""
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    try:
                        reply = command(json.loads(line))
                    except (ValueError, OSError) as exc:
                        reply = {"ok": False, "error": repr(exc)}
                    await stream.send_all(json.dumps(reply).encode() + b"\n")

    async def control_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        control.unlink(missing_ok=True)
        await sock.bind(str(control))
        sock.listen(4)
        task_status.started()
        async with trio.open_nursery() as clients:
            while True:
                conn, _ = await sock.accept()
                clients.start_soon(client, conn)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(control_server)

            async def on_sigterm() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(on_sigterm)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    options = set(pyfuse3.default_options) | {"fsname=streamwal-lazyfs", "subtype=lazyfs"}
    pyfuse3.init(ops, str(mountpoint), options)
    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)
        state.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: lazyfs.py BACKING MOUNTPOINT CONTROL_SOCKET")
    serve(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
