"""Fault injectors for the nemesis suite: the harm real disks, networks and clocks do.

Each injector changes the machine in one bounded way and undoes it in `close()`, which is
idempotent and runs even when a test fails (`tests/nemesis/conftest.py` registers every
one in the test's clean-up stack, after the processes that use it are killed):

- `LazyMount`: a FUSE file system (`lazyfs.py`, its own process) that loses what was not
  fsync'ed on `power_loss()`;
- `Network`: hosts in their own network namespaces on a bridge, each with its own
  address; `isolate()` drops traffic between hosts with iptables, `heal()` restores it;
- `faketime_env()`: the environment that runs a process with a shifted clock (libfaketime);
- `Tmpfs` (fill it: ENOSPC) and `Ext4Image` (an ext4 file system on a loop device that
  goes read-only after an error, as a failing disk does);
- `flip_bits()`, `truncate_file()`, `flush_offline()`: corruption of RocksDB files;
- `pause()`/`resume()`: SIGSTOP/SIGCONT of any process.

Everything here needs root (mounts, namespaces, loop devices), as the suite runs in CI.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import ipaddress
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LAZYFS = Path(__file__).with_name("lazyfs.py")


def run(*argv: str, timeout: float = 30.0, check: bool = True) -> str:
    """Run a command; its stdout, or AssertionError with its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def unmount(path: Path) -> None:
    """Unmount `path` (lazily if it is busy); no error if it is not mounted."""
    if mounted(path):
        done = subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
        if done.returncode != 0 and mounted(path):
            run("umount", "-l", str(path))


# --------------------------------------------------------------------- power loss


class LazyMount:
    """`mountpoint` served by lazyfs from `workdir` (its backing files, control socket)."""

    def __init__(self, mountpoint: Path, workdir: Path) -> None:
        self.mountpoint = mountpoint
        self.workdir = workdir
        self.control = workdir / "control.sock"
        self.log = workdir / "lazyfs.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> LazyMount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(LAZYFS), str(self.workdir / "backing"),
                 str(self.mountpoint), str(self.control)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lazyfs exited at start:\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if mounted(self.mountpoint) and self.request(op="ping")["ok"]:
                    return self
            time.sleep(0.05)
        self.close()
        raise TimeoutError(f"lazyfs not serving {self.mountpoint} after {timeout}s")

    def request(self, **request) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(str(self.control))
            sock.sendall(json.dumps(request).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("lazyfs closed the control connection")
                reply += chunk
        answer = json.loads(reply)
        if not answer.get("ok"):
            raise AssertionError(f"lazyfs refused {request}: {answer}")
        return answer

    def power_loss(self, keep: float = 0.0, seed: int = 0) -> dict:
        """Drop everything not synced (kill the processes using the mount first)."""
        return self.request(op="power_loss", keep=keep, seed=seed)

    def unsynced(self) -> dict:
        return self.request(op="unsynced")

    def stall_syncs(self, seconds: float) -> None:
        """Every fsync and fdatasync from now on returns only `seconds` from now."""
        self.request(op="stall_syncs", seconds=seconds)

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], timeout=10)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        unmount(self.mountpoint)  # a killed lazyfs leaves its mount behind
        self.proc = None


# --------------------------------------------------------------------- network

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class Network:
    """`hosts` network namespaces on one bridge in the root namespace.

    Host i (1-based) gets the address ``<subnet>.i``; the bridge (the root namespace: the
    coord and the test) gets ``<subnet>.254``. Names carry a random token, so parallel
    test runs do not collide; the /24 is one no interface of this machine uses.
    """

    def __init__(self, hosts: int) -> None:
        self.token = secrets.token_hex(2)
        self.bridge = f"nm{self.token}br"
        self.names = {i: f"nemesis-{self.token}-{i}" for i in range(1, hosts + 1)}
        self.subnet = self._free_subnet()
        self.created: list[str] = []
        self.bridge_up = False

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used = [
            ipaddress.ip_interface(m).network
            for m in re.findall(r"inet (\S+)", run("ip", "-4", "-o", "addr"))
        ]
        rng = random.Random()
        for _ in range(200):
            net = ipaddress.ip_network(f"10.{rng.randint(200, 250)}.{rng.randint(0, 255)}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise RuntimeError("no free 10.x.y.0/24 for the nemesis network")

    def address(self, host: int) -> str:
        return str(self.subnet.network_address + host)

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 254)

    def start(self) -> Network:
        prefix = self.subnet.prefixlen
        run("ip", "link", "add", self.bridge, "type", "bridge")
        self.bridge_up = True
        run("ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for host, ns in self.names.items():
            run("ip", "netns", "add", ns)
            self.created.append(ns)
            veth = f"nm{self.token}v{host}"
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", veth, "master", self.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{self.address(host)}/{prefix}", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def run_in(self, host: int, fn: Callable[[], T]) -> T:
        """`fn()` in a new thread that entered host's namespace: the processes it starts
        live there. (Python 3.11 has no os.setns; a thread's namespace ends with it.)"""
        result: list = []

        def enter_and_run() -> None:
            try:
                with open(f"/run/netns/{self.names[host]}") as ns:
                    if _libc.setns(ns.fileno(), _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns failed")
                result.append(fn())
            except BaseException as exc:  # re-raised in the caller
                result.append(exc)

        thread = threading.Thread(target=enter_and_run, name=f"netns-{host}")
        thread.start()
        thread.join()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def isolate(self, host: int, peers: list[int], gateway: bool = False) -> None:
        """Drop every packet between `host` and `peers` (both ways, established
        connections too); the bridge (coord, test) still reaches it unless `gateway`."""
        ns = self.names[host]
        ips = [self.address(peer) for peer in peers] + ([self.gateway] if gateway else [])
        for ip in ips:
            run("ip", "netns", "exec", ns, "iptables", "-w", "-A", "INPUT", "-s", ip, "-j", "DROP")
            run("ip", "netns", "exec", ns, "iptables", "-w", "-A", "OUTPUT", "-d", ip, "-j", "DROP")

    def heal(self, host: int) -> None:
        for chain in ("INPUT", "OUTPUT"):
            run("ip", "netns", "exec", self.names[host], "iptables", "-w", "-F", chain)

    def close(self) -> None:
        for ns in self.created:  # deleting a namespace deletes its veth pair
            run("ip", "netns", "del", ns, check=False)
        self.created.clear()
        if self.bridge_up:
            run("ip", "link", "del", self.bridge, check=False)
            self.bridge_up = False


# --------------------------------------------------------------------- clock


def faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process with its wall clock shifted by `offset`
    (libfaketime: "+1h", "-30s"); its monotonic clock stays true, as on a machine whose
    clock is wrong. libfaketime's pthread_cond_timedwait work-around for monotonic clocks
    (needless when only the wall clock is shifted) slowed a node tenfold under load, so
    that the coord declared it lost every few seconds (measured with libfaketime 0.9.10):
    it is off, and file times are not faked."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (scripts/setup --test installs it)")
    return {
        "LD_PRELOAD": found[0],
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        "NO_FAKE_STAT": "1",
    }


# --------------------------------------------------------------------- disks


class Tmpfs:
    """A tmpfs of `size` at `mountpoint`: `fill()` takes all its free space, `free()`
    gives it back."""

    def __init__(self, mountpoint: Path, size: str = "64m") -> None:
        self.mountpoint = mountpoint
        self.size = size
        self.filler = mountpoint / "nemesis-filler"
        self.mounted = False

    def start(self) -> Tmpfs:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        run("mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.mountpoint))
        self.mounted = True
        return self

    def fill(self) -> int:
        """Write until ENOSPC; the bytes written."""
        written = 0
        chunk = bytes(1 << 20)
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while written < 1 << 34:  # the bound: no tmpfs here is that big
                    written += f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            with contextlib.suppress(OSError):  # the last bytes, below a chunk
                while written < 1 << 34:
                    written += f.write(bytes(4096))
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            unmount(self.mountpoint)
            self.mounted = False


class Ext4Image:
    """An ext4 file system of `size` in an image file on a loop device at `mountpoint`,
    mounted ``errors=remount-ro``: `read_only()` reports a file system error, after which
    the kernel refuses every write (EROFS) while files stay open, as on a failing disk.
    `repair()` (the users of the mount stopped) checks it and mounts it writable again."""

    def __init__(self, mountpoint: Path, image: Path, size: str = "128M") -> None:
        self.mountpoint = mountpoint
        self.image = image
        self.size = size
        self.mounted = False

    def start(self) -> Ext4Image:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        run("truncate", "-s", self.size, str(self.image))
        run("mkfs.ext4", "-q", "-F", str(self.image))
        self._mount()
        return self

    def _mount(self) -> None:
        run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mountpoint))
        self.mounted = True

    def read_only(self) -> None:
        source = run("findmnt", "-n", "-o", "SOURCE", str(self.mountpoint)).strip()
        device = Path(source).name
        Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("nemesis: read-only disk\n")

    def repair(self) -> None:
        unmount(self.mountpoint)
        self.mounted = False
        run("e2fsck", "-f", "-y", str(self.image), check=False)  # exits 1 when it fixed
        self._mount()

    def close(self) -> None:
        if self.mounted:
            unmount(self.mountpoint)  # the loop device goes with it (autoclear)
            self.mounted = False


# --------------------------------------------------------------------- corruption


def rocksdb_files(data_dir: Path, suffix: str) -> list[Path]:
    """The RocksDB files of a kind (".log", ".sst"), oldest first (by file number)."""
    return sorted(data_dir.glob(f"*{suffix}"), key=lambda p: int(p.stem))


def flip_bits(path: Path, rng: random.Random, count: int = 16) -> list[int]:
    """Flip one random bit in each of `count` consecutive bytes in the middle of the
    file; returns their offsets."""
    size = path.stat().st_size
    if size < count:
        raise AssertionError(f"{path} holds {size} bytes, too few to flip {count}")
    start = size // 2 - count // 2
    with open(path, "r+b") as f:
        f.seek(start)
        data = bytearray(f.read(count))
        for i in range(count):
            data[i] ^= 1 << rng.randrange(8)
        f.seek(start)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return list(range(start, start + count))


def truncate_file(path: Path, keep: float = 0.5) -> int:
    """Cut the file to `keep` of its size; returns the new size."""
    size = int(path.stat().st_size * keep)
    os.truncate(path, size)
    return size


def flush_offline(data_dir: Path) -> None:
    """Open a stopped node's RocksDB and flush its memtable into an SST, so the newest
    acknowledged records sit in a .sst file to corrupt (the node keeps them in its WAL
    and memtable until 64 MiB accumulate)."""
    from rocksdict import Options, Rdict

    db = Rdict(str(data_dir), Options(raw_mode=True))
    try:
        db.flush(wait=True)
    finally:
        db.close()


# --------------------------------------------------------------------- processes


def pause(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGSTOP)


def resume(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
