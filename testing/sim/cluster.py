"""One simulated run: nodes, the real coordinator, producers and consumers, a nemesis.

A run is a function of its seed. It builds a cluster on the virtual-time loop: N
`SimNode`s (real per-pchannel cores over simulated disks), the real `Coordinator` (planner,
sagas, executor) over an in-memory meta store and simulated links, idempotent producers
writing numbered messages and consumers reading committed ones, all through the simulated
network. For `fault_time` seconds the nemesis crashes and restarts nodes, pauses them,
partitions the network, loses and delays messages, fails disks and kills the coord
(between steps or right after a named saga step); then everything heals, producers finish
what they sent, and the run must converge (every pchannel served by all its replicas)
within `converge_time`. The history checker then reads every replica's disk against what
producers got acknowledged and consumers saw. Node invariants, errors logged by the coord
or the nodes, and cuts below a replicated commit offset fail the run as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections import deque
from dataclasses import dataclass, field

from streamwal.coord import state_machine as sm
from streamwal.coord.coordinator import CoordConfig, Coordinator
from streamwal.coord.meta_store import MemoryMetaStore
from streamwal.coord.sagas import TERM_CHANGE_STEPS
from streamwal.errors import StreamingError, Unavailable
from streamwal.node import records
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing import history
from streamwal.testing.sim.loop import VirtualLoop
from streamwal.testing.sim.net import COORD, Faults, Network
from streamwal.testing.sim.node import SimNode

CLIENTS = 100  # client endpoint ids start here


@dataclass
class Config:
    """One run's shape; `for_seed` draws it from the seed."""

    nodes: int = 3
    pchannels: int = 2
    replicas: int = 3
    producers: int = 2  # per pchannel
    batch: int = 3  # messages per batch, at most
    fault_time: float = 8.0
    produce_time: float = 10.0  # producers start new batches until then
    converge_time: float = 30.0
    probe_interval: float = 0.25
    grace: float = 1.0
    tick_interval: float = 0.5
    # A replication pull with nothing new waits this long on the leader for new records
    # or a new commit offset (the leader's Notify ends the wait at once, as a real
    # stream's push would); the follower gives up on a pull after `pull_timeout`.
    pull_wait: float = 1.0
    pull_timeout: float = 1.0
    disk_latency: tuple[float, float] = (0.0005, 0.002)
    epoch_ms: int = 1_700_000_000_000
    faults_per_second: float = 1.5
    clean: bool = False  # single replicas: only faults a catch-up move survives
    max_down: float = 3.0  # seconds a crashed/paused/cut node stays so, at most
    # Leadership churn: a node told to lead is killed within 30 ms with this probability
    # (the nemesis aims at primaries, as Jepsen's do).
    kill_new_leader: float = 0.0

    @staticmethod
    def for_seed(seed: int) -> Config:
        rng = random.Random(seed ^ 0x5EED)
        if seed % 5 == 4:  # one run in five: single replicas with moves that catch up
            return Config(
                nodes=rng.choice([2, 3]),
                pchannels=rng.choice([1, 2, 3]),
                replicas=1,
                grace=4.0,
                max_down=2.0,
                clean=True,
            )
        if seed % 3 == 2:  # one run in three: leadership churn on a small cluster
            return Config(
                nodes=3,
                pchannels=1,
                producers=rng.choice([1, 2]),
                faults_per_second=rng.choice([1.5, 3.0]),
                max_down=1.0,
                kill_new_leader=rng.choice([0.3, 0.6]),
            )
        return Config(
            nodes=rng.choice([3, 3, 4, 5]),
            pchannels=rng.choice([1, 2, 3]),
            replicas=rng.choice([3, 3, 5]) if seed % 7 == 6 else 3,
            producers=rng.choice([1, 2]),
            faults_per_second=rng.choice([0.8, 1.5, 3.0]),
        )


@dataclass
class Outcome:
    seed: int
    config: Config
    verdict: history.Verdict
    failures: list[str] = field(default_factory=list)
    digest: str = ""
    events: int = 0
    virtual_s: float = 0.0
    faults: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.failures

    def report(self) -> str:
        head = "ok" if self.ok else "FAILED"
        lines = [
            f"seed {self.seed}: {head} ({self.config.nodes} nodes, {self.config.pchannels} "
            f"pchannels x {self.config.replicas} replicas, {len(self.faults)} faults, "
            f"{self.virtual_s:.1f}s simulated): {self.verdict.summary()}"
        ]
        if not self.ok:
            lines += [f"  failure: {f}" for f in self.failures]
            lines.append("  faults: " + "; ".join(self.faults))
            lines.append("  last log lines:")
            lines += [f"    {line}" for line in self.log[-40:]]
            lines.append(f"  replay: python -m streamwal.testing.sim --seed {self.seed} -v")
        return "\n".join(lines)


class _Crash(BaseException):
    """The coord dies right here (a step hook): nothing after it runs."""


class _Capture(logging.Handler):
    """Keeps the last log lines and fails the run on any error a component logs."""

    def __init__(self, cluster: Cluster, verbose: bool) -> None:
        super().__init__(logging.DEBUG if verbose else logging.INFO)
        self.cluster = cluster
        self.lines: deque[str] = deque(maxlen=400)

    def emit(self, record: logging.LogRecord) -> None:
        extra = {
            k: v
            for k, v in record.__dict__.items()
            if k in ("pchannel", "node", "term", "step", "reason", "error", "new_node")
        }
        now = self.cluster.loop.time()
        self.lines.append(f"{now:8.3f} {record.levelname:7} {record.getMessage()} {extra}")
        if record.levelno >= logging.ERROR:
            self.cluster.fail(f"logged error: {record.getMessage()} {extra}")
        if self.cluster.config.clean and record.getMessage() == "unclean failover":
            self.cluster.fail(f"unclean failover in a clean run: {extra}")


class SimLinks:
    """The coord's links to nodes over the simulated network (executor.Links)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.closed = False

    def _node(self, address: str) -> SimNode:
        if self.closed:
            raise Unavailable("this coord is dead")
        node = self.cluster.node_by_address(address)
        if node is None:
            raise Unavailable(f"unknown node {address}")
        return node

    async def assign(
        self,
        address: str,
        name: str,
        term: int,
        timeout: float,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
        retention: pb.RetentionPolicy | None = None,
    ) -> None:
        node = self._node(address)
        await self.cluster.net.call(
            COORD,
            node.id,
            lambda: node.assign(
                name,
                term,
                catch_up_from,
                min_next_offset,
                replica_set,
                accept_data_loss,
                retention,
            ),
            timeout,
            "assign",
        )
        if replica_set is not None and replica_set.role == pb.REPLICA_ROLE_LEADER:
            self.cluster.leading(node)

    async def fence(self, address: str, name: str, term: int, timeout: float) -> pb.FenceResponse:
        node = self._node(address)
        return await self.cluster.net.call(
            COORD, node.id, lambda: node.fence(name, term), timeout, "fence"
        )

    async def remove(self, address: str, name: str, term: int, timeout: float) -> None:
        node = self._node(address)
        await self.cluster.net.call(
            COORD, node.id, lambda: node.remove(name, term), timeout, "remove"
        )

    async def collect_status(
        self, address: str, timeout: float
    ) -> pb.StreamingNodeManagerCollectStatusResponse:
        node = self._node(address)
        return await self.cluster.net.call(
            COORD, node.id, node.collect_status, timeout, "collect-status"
        )

    def reconnect(self, address: str) -> None:
        """The simulated network keeps no connections: nothing to renew."""

    async def close(self) -> None:
        self.closed = True


class _CoordStore(MemoryMetaStore):
    """The shared store as one coord incarnation sees it: dead once that coord died."""

    def __init__(self, shared: MemoryMetaStore) -> None:
        self.__dict__.update(shared.__dict__)  # the same dicts: one store
        self.dead = False

    async def _persist(self, space: int, key: str, version: int, payload: bytes | None) -> None:
        if self.dead:
            raise Unavailable("this coord is dead")


class Cluster:
    def __init__(self, seed: int, config: Config, verbose: bool = False) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.loop = VirtualLoop()
        self.net = Network(self.rng, Faults())
        self.nodes = {i: SimNode(self, i) for i in range(1, config.nodes + 1)}
        self._by_address = {n.address: n for n in self.nodes.values()}
        for node in self.nodes.values():
            self.net.endpoints[node.id] = node
        self.store = MemoryMetaStore()
        self.coord: Coordinator | None = None
        self._coord_handles: tuple[_CoordStore, SimLinks] | None = None
        self.crash_at: tuple[str, int] | None = None  # (saga step, occurrences left)
        self.view: dict[str, tuple[int, int]] = {}  # pchannel -> (node, term), as discovered
        self.failures: list[str] = []
        self.faults: list[str] = []
        self.acked: dict[str, list[history.Acked]] = {}
        self.seen: dict[str, list[tuple[int, bytes]]] = {}
        self.clients: list[_Client] = []
        self.names: list[str] = []
        self.capture = _Capture(self, verbose)
        self._faulting = True

    # ----------------------------------------------------------------- plumbing

    def wall(self) -> float:
        """Simulated wall-clock seconds: every clock in the run agrees with it."""
        return self.config.epoch_ms / 1000 + self.loop.time()

    def node_by_address(self, address: str) -> SimNode | None:
        return self._by_address.get(address)

    def fail(self, why: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(f"{self.loop.time():.3f}s {why}")

    def _watch(self, task: asyncio.Task) -> None:
        """A background task that dies of anything but cancellation is a bug."""

        def done(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, (StreamingError, _Crash)):
                    self.fail(f"task {t.get_name()} died: {exc!r}")

        task.add_done_callback(done)

    def _note(self, fault: str) -> None:
        self.faults.append(f"{self.loop.time():.2f}s {fault}")

    # ----------------------------------------------------------------- coord

    def _step_hook(self, step: str, pchannel: str) -> None:
        if self.crash_at is None or self.crash_at[0] != step:
            return
        left = self.crash_at[1] - 1
        self.crash_at = (step, left) if left > 0 else None
        if left <= 0:
            back = self.rng.uniform(0.1, self.config.max_down)
            self._note(f"coord killed right after {step} of {pchannel}, back after {back:.2f}s")
            self.kill_coord()
            self.loop.call_later(back, self._restart_coord)
            raise _Crash()

    async def start_coord(self) -> None:
        store, links = _CoordStore(self.store), SimLinks(self)
        self._coord_handles = (store, links)
        config = CoordConfig(
            nodes={n.id: n.address for n in self.nodes.values()},
            probe_interval=self.config.probe_interval,
            grace=self.config.grace,
            assign_timeout=2.0,
            remove_timeout=0.5,
            fence_timeout=1.0,
        )
        coord = Coordinator(
            store,
            config,
            links=links,
            clock=self.loop.time,
            step_hooks=[self._step_hook],
            wall=self.wall,
        )
        self.coord = coord
        await coord.start()
        for task in coord._tasks:
            self._watch(task)
        watcher = asyncio.ensure_future(self._discover(coord))
        coord._tasks.append(watcher)

    def leading(self, node: SimNode) -> None:
        """A node was just told to lead: the churn nemesis may stall its disk and kill it
        right away (before its followers copied its first record, or soon after)."""
        if not self._faulting or not self.config.kill_new_leader:
            return
        if self.rng.random() < 0.5:  # its disk stalls as it takes over (a slow first sync)
            self._stall(node, 0.3)
        if self.rng.random() < self.config.kill_new_leader:
            self.loop.call_later(self.rng.uniform(0.0, 0.03), self._kill, node, "new leader")

    def _kill(self, node: SimNode, why: str) -> None:
        if node.up and self._faulting:
            back = self.rng.uniform(0.05, self.config.max_down)
            self._note(f"kill -9 node {node.id} ({why}), back after {back:.2f}s")
            node.crash()
            self.loop.call_later(back, self._restart, node)

    async def _discover(self, coord: Coordinator) -> None:
        """What clients learn from AssignmentDiscover (shared by all simulated clients)."""
        queue = coord.hub.subscribe()
        while True:
            update = await queue.get()
            if update is None:
                return
            for assignment in update.full_assignment.assignments:
                for info in assignment.channels:
                    self.view[info.name] = (assignment.node.server_id, info.term)

    def kill_coord(self) -> None:
        coord, self.coord = self.coord, None
        if coord is None:
            return
        if self._coord_handles is not None:
            self._coord_handles[0].dead = True
            self._coord_handles[1].closed = True
        for task in coord._tasks:
            task.cancel()

    # ----------------------------------------------------------------- the run

    async def run(self) -> None:
        cfg = self.config
        for node in self.nodes.values():
            node.start()
        await self.start_coord()
        assert self.coord is not None
        owner = cpb.OwnerDescription(role="sim")
        self.names = await self.coord.create_channels(owner, cfg.pchannels, "sim", cfg.replicas)
        for name in self.names:
            self.acked[name] = []
            self.seen[name] = []
            for p in range(cfg.producers):
                self.clients.append(_Producer(self, len(self.clients), name, f"{name}-p{p}"))
            self.clients.append(_Consumer(self, len(self.clients), name))
        for client in self.clients:
            self.net.endpoints[client.id] = client
            self._watch(client.spawn(client.run()))
        await self._nemesis(cfg.fault_time)
        await self._heal()
        await self._converge()

    async def _nemesis(self, until: float) -> None:
        rng, cfg = self.rng, self.config
        if not cfg.clean and rng.random() < 0.5:
            self.crash_at = (rng.choice(TERM_CHANGE_STEPS).value, rng.randint(1, 3))
        while self.loop.time() < until:
            await asyncio.sleep(rng.expovariate(cfg.faults_per_second))
            if self.loop.time() >= until:
                break
            self._fault()

    def _victim(self) -> SimNode:
        """A node to hit: often the leader of some pchannel (where faults hurt most)."""
        rng = self.rng
        if self.coord is not None and self.names and rng.random() < 0.6:
            stored = self.coord.records.get(rng.choice(self.names))
            if stored is not None and stored.record.meta.node.server_id in self.nodes:
                return self.nodes[stored.record.meta.node.server_id]
        return self.nodes[rng.randint(1, self.config.nodes)]

    def _fault(self) -> None:
        if not self._faulting:
            return  # a burst's late fault after the heal
        rng, cfg = self.rng, self.config
        node = self._victim()
        kinds = ["crash", "coord-crash", "delay", "disk", "slow-disk"]
        if not cfg.clean:
            kinds += ["crash", "pause", "isolate", "split", "loss", "leader-cut"]
        kind = rng.choice(kinds)
        span = rng.uniform(0.02, cfg.max_down) if rng.random() < 0.3 else rng.uniform(0.1, 1.0)
        if rng.random() < 0.3:  # faults come in bursts
            self.loop.call_later(rng.uniform(0.0, 0.1), self._fault)
        if kind == "crash" and node.up:
            self._note(f"kill -9 node {node.id}, back after {span:.2f}s")
            node.crash()
            self.loop.call_later(span, self._restart, node)
            if rng.random() < 0.3:  # its disk stalls after the restart (a slow recovery)
                self.loop.call_later(span, self._stall, node, 1.0)
        elif kind == "pause" and node.up:
            self._note(f"pause node {node.id} for {span:.2f}s")
            node.pause()
            self.loop.call_later(span, node.resume)
        elif kind == "isolate":
            pairs = {
                frozenset((node.id, other)) for other in [COORD, *self.nodes] if other != node.id
            }
            self._note(f"isolate node {node.id} for {span:.2f}s")
            self._cut(pairs, span)
        elif kind == "split":
            ids = list(self.nodes)
            rng.shuffle(ids)
            side = set(
                ids[: rng.randint(1, len(ids) - 1)] + ([COORD] if rng.random() < 0.5 else [])
            )
            other = (set(self.nodes) | {COORD}) - side
            pairs = {frozenset((a, b)) for a in side for b in other}
            self._note(f"partition {sorted(side)} | {sorted(other)} for {span:.2f}s")
            self._cut(pairs, span)
        elif kind == "loss":
            self._note(f"lose 10% of messages for {span:.2f}s")
            self.net.faults.loss = 0.1
            self.loop.call_later(span, setattr, self.net.faults, "loss", 0.0)
        elif kind == "delay":
            self._note(f"slow network for {span:.2f}s")
            self.net.faults.delay = (0.005, 0.15)
            self.loop.call_later(span, setattr, self.net.faults, "delay", Faults().delay)
        elif kind == "disk" and node.up:
            self._note(f"disk writes fail on node {node.id} for {span:.2f}s")
            node.disk.failing = True
            self.loop.call_later(span, setattr, node.disk, "failing", False)
        elif kind == "slow-disk":
            self._note(f"node {node.id}'s disk stalls up to 80 ms for {span:.2f}s")
            node.disk.slow = 0.08
            self.loop.call_later(span, setattr, node.disk, "slow", 0.0)
        elif kind == "leader-cut":
            pairs = {frozenset((node.id, other)) for other in self.nodes if other != node.id}
            self._note(f"cut node {node.id} from the other nodes (not the coord) for {span:.2f}s")
            self._cut(pairs, span)
        elif kind == "coord-crash" and self.coord is not None:
            self._note(f"kill -9 the coord, back after {span:.2f}s")
            self.kill_coord()
            self.loop.call_later(span, self._restart_coord)

    def _stall(self, node: SimNode, span: float) -> None:
        if self._faulting:
            node.disk.slow = 0.08
            self.loop.call_later(span, setattr, node.disk, "slow", 0.0)

    def _cut(self, pairs: set[frozenset[int]], span: float) -> None:
        self.net.faults.cut |= pairs
        self.loop.call_later(span, self.net.faults.cut.difference_update, pairs)

    def _restart(self, node: SimNode) -> None:
        if not node.up and self._faulting:
            node.start()

    def _restart_coord(self) -> None:
        if self.coord is None:
            self._watch(asyncio.ensure_future(self.start_coord()))

    async def _heal(self) -> None:
        """Every fault ends: nodes up and running, the network whole, the coord back."""
        self._note("heal")
        self._faulting = False
        self.crash_at = None
        self.net.faults = Faults()
        for node in self.nodes.values():
            node.disk.failing = False
            node.disk.slow = 0.0
            node.resume()
            if not node.up:
                node.start()
        if self.coord is None:
            await self.start_coord()

    async def _converge(self) -> None:
        """Producers finish, then every pchannel must be served by all its replicas with
        one log; the check runs on that state (no await in between)."""
        deadline = self.config.produce_time + self.config.converge_time
        while self.loop.time() < deadline:
            if all(c.done for c in self.clients) and self._settled():
                return
            await asyncio.sleep(0.1)
        busy = [c.name for c in self.clients if not c.done]
        unsettled = [n for n in self.names if not self._settled([n])]
        self.fail(f"no convergence: clients still sending {busy}, pchannels {unsettled}")

    def _settled(self, names: list[str] | None = None) -> bool:
        if self.coord is None:
            return False
        for name in names or self.names:
            stored = self.coord.records.get(name)
            if stored is None or stored.record.meta.state != sm.ASSIGNED:
                return False
            members = [m.server_id for m in stored.record.members] or [
                stored.record.meta.node.server_id
            ]
            ends = set()
            for node_id in members:
                core = self.nodes[node_id].cores.get(name)
                if core is None or core.term != stored.record.meta.channel.term:
                    return False
                if not core.drained or (
                    core.commit is not None and core.commit != core.committed_next
                ):
                    return False
                ends.add(core.committed_next)
            if len(ends) != 1:
                return False
        return True

    # ----------------------------------------------------------------- the check

    def check(self) -> history.Verdict:
        total = history.Verdict()
        for name in self.names:
            members = self._members(name)
            logs = []
            for node_id in members:
                disk = self.nodes[node_id].disk
                stored = [(b, disk.logs[name][b]) for b in disk.bases(name)]
                logs.append(history.parse_log(f"node {node_id}", stored))
            verdict = history.check(logs, self.acked[name], self.seen[name])
            total.merge(verdict)
            if self.config.replicas > 1:
                for node in self.nodes.values():
                    core = node.cores.get(name)
                    if core is not None and core.unclean_cuts:
                        self.fail(f"node {node.id} cut {name} below its commit offset")
        return total

    def _members(self, name: str) -> list[int]:
        stored = self.store._channels.get(name)
        if stored is None:
            return []
        record = stored[0]
        return [m.server_id for m in record.members] or [record.meta.node.server_id]

    def digest(self) -> str:
        """A fingerprint of the run's outcome: the same seed must give the same one."""
        h = hashlib.sha256()
        for name in self.names:
            for a in self.acked[name]:
                h.update(f"{a.producer}:{a.index}@{a.offset}/{a.term};".encode())
            for node in self.nodes.values():
                for base in node.disk.bases(name):
                    h.update(node.disk.logs[name][base])
        h.update(repr(self.faults).encode())
        return h.hexdigest()[:16]


class _Client:
    """A simulated client process: an endpoint that never crashes."""

    def __init__(self, cluster: Cluster, index: int, pchannel: str) -> None:
        self.cluster = cluster
        self.id = CLIENTS + index
        self.pchannel = pchannel
        self.name = f"client-{index}"
        self.done = False
        self._running = asyncio.Event()
        self._running.set()

    @property
    def up(self) -> bool:
        return True

    async def awake(self) -> None:
        await self._running.wait()

    def spawn(self, work):
        return asyncio.ensure_future(work)

    def route(self) -> SimNode | None:
        got = self.cluster.view.get(self.pchannel)
        return self.cluster.nodes.get(got[0]) if got else None

    async def run(self) -> None:
        raise NotImplementedError


class _Producer(_Client):
    """An idempotent producer: numbered messages in batches, each batch resent (same
    sequence) until acknowledged, following the discovered owner."""

    def __init__(self, cluster: Cluster, index: int, pchannel: str, producer: str) -> None:
        super().__init__(cluster, index, pchannel)
        self.name = producer

    async def run(self) -> None:
        cluster, rng = self.cluster, self.cluster.rng
        index, sequence = 0, 0
        try:
            while cluster.loop.time() < cluster.config.produce_time:
                count = rng.randint(1, cluster.config.batch)
                body = pb.MessageBatch(
                    messages=[
                        pb.Message(payload=history.payload(self.name, index + i))
                        for i in range(count)
                    ]
                ).SerializeToString()
                sequence += 1
                if not await self._send(sequence, body, count, index):
                    return
                index += count
                await asyncio.sleep(rng.uniform(0.0, 0.05))
        finally:
            self.done = True

    async def _send(self, sequence: int, body: bytes, count: int, index: int) -> bool:
        """Resend until acknowledged; False when the run ends first."""
        cluster = self.cluster
        deadline = cluster.config.produce_time + cluster.config.converge_time - 5.0
        while cluster.loop.time() < deadline:
            view = cluster.view.get(self.pchannel)
            node = cluster.nodes.get(view[0]) if view else None
            if view is None or node is None:
                await asyncio.sleep(0.1)
                continue
            term = view[1]
            try:
                base, _ = await cluster.net.call(
                    self.id,
                    node.id,
                    lambda n=node, t=term: n.produce(
                        self.pchannel, t, (self.name, sequence), body, count
                    ),
                    2.0,
                    "produce",
                )
            except StreamingError:
                await asyncio.sleep(cluster.rng.uniform(0.02, 0.2))
                continue
            cluster.acked[self.pchannel].extend(
                history.Acked(self.name, index + i, base + i, term) for i in range(count)
            )
            return True
        return False


class _Consumer(_Client):
    """Reads committed messages from the discovered owner, from the start, throughout."""

    async def run(self) -> None:
        cluster = self.cluster
        offset = 0
        try:
            while cluster.loop.time() < cluster.config.produce_time + 1.0:
                view = cluster.view.get(self.pchannel)
                node = cluster.nodes.get(view[0]) if view else None
                if view is None or node is None:
                    await asyncio.sleep(0.1)
                    continue
                try:
                    got = await cluster.net.call(
                        self.id,
                        node.id,
                        lambda n=node, t=view[1], o=offset: n.read(self.pchannel, t, o),
                        1.0,
                        "read",
                    )
                except StreamingError:
                    await asyncio.sleep(0.1)
                    continue
                for base, value in got:
                    rec = records.decode(value)
                    end = base + rec.count
                    if end <= offset:
                        continue
                    if not rec.flags & records.FLAG_TIME_TICK:
                        batch = pb.MessageBatch.FromString(rec.body)
                        for i, message in enumerate(batch.messages):
                            if base + i >= offset:
                                cluster.seen[self.pchannel].append((base + i, message.payload))
                    offset = end
                if not got:
                    await asyncio.sleep(0.05)
        finally:
            self.done = True


def run_seed(seed: int, config: Config | None = None, verbose: bool = False) -> Outcome:
    """Run one seed to its verdict (deterministic: the same seed, the same outcome)."""
    config = config or Config.for_seed(seed)
    cluster = Cluster(seed, config, verbose)
    logger = logging.getLogger("streamwal")
    saved = logger.level, logger.propagate
    logger.addHandler(cluster.capture)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    asyncio.set_event_loop(cluster.loop)
    try:
        cluster.loop.run_until_complete(cluster.run())
        verdict = cluster.check()
    finally:
        logger.removeHandler(cluster.capture)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        _close(cluster.loop)
        asyncio.set_event_loop(None)
    return Outcome(
        seed,
        config,
        verdict,
        cluster.failures,
        cluster.digest(),
        cluster.net.calls,
        cluster.loop.time(),
        cluster.faults,
        list(cluster.capture.lines),
    )


def _close(loop: VirtualLoop) -> None:
    """Cancel whatever still runs (background loops) and close the loop."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
