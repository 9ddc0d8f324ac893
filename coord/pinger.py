"""The coord's second liveness signal: pings to the nodes' probe ports from a thread.

CollectStatus probes run on the coord's event loop and are answered on the node's; both
loops carry the cluster's work, and at a thousand pchannels either may be late by more
than a probe deadline. A late answer then looked like a dead node, the failover it
started loaded everything more, and healthy nodes were lost over and over (issue 24).

The Pinger sends a small Ping every `interval` to each node's probe port (node/probe_port.py)
from a thread of its own, over blocking gRPC channels, and stamps each outcome with the
monotonic time it arrived: a coord loop that is busy reads the outcomes late but still
sees when they happened. A ping counts as a success only from the expected node and with
its event loop turning (a node whose loop stalled longer than `max_stall` is alive but
serves nothing). The LivenessTracker combines these outcomes with CollectStatus's.

A node that misses `REDIAL_AFTER` pings in a row without refusing them is pinged on a
new connection from then on, one per failed ping: a network partition leaves the old one
resending into the loss at TCP's backed-off retransmission times, so after the partition
healed the node was heard only 2 s later (the seeded fault schedule of seed 112700 then
missed its promise); a new connection is heard at the next ping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import grpc

from streamwal.coord.liveness import refused
from streamwal.proto import wire_pb2
from streamwal.transport import TransportConfig, make_sync_channel

_PING = "/streamwal.wire.StreamingNodeProbeService/Ping"


@dataclass(frozen=True)
class Heard:
    node: int
    ok: bool
    at: float  # monotonic time the outcome arrived
    refused: bool = False  # the connection was refused: nothing listens there


# A ping's deadline, in probe intervals. A ping that answers late is still a success:
# at a machine load of 15-21 the node's probe threads answered pings after 0.5-1.3 s,
# and a deadline of one interval made those healthy nodes SUSPECT (no new followers) a
# few times a minute (issue 24). Detection does not wait for it: a killed node refuses
# the connection at once, and a hung one is lost by the tracker's grace whatever the
# deadline (while a ping is pending, the node is not pinged again).
DEADLINE_INTERVALS = 2
# Failed pings in a row (not refused) after which each ping goes on a new connection:
# one late answer from a loaded node keeps its connection.
REDIAL_AFTER = 2


class Pinger:
    """Pings every watched node each `interval` (deadline: `DEADLINE_INTERVALS`
    intervals) from its thread."""

    def __init__(
        self,
        interval: float,
        max_stall: float,
        config: TransportConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.max_stall_ms = max_stall * 1000
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[int, str] = {}
        self._channels: dict[str, tuple[grpc.Channel, grpc.UnaryUnaryMultiCallable]] = {}
        self._pending: set[int] = set()
        self._failed: dict[int, int] = {}  # node -> pings failed in a row (not refused)
        self._redial: set[str] = set()  # addresses whose next ping opens a new connection
        self._heard: list[Heard] = []
        self._stop = threading.Event()
        self._wake = threading.Event()  # a new target: ping it now, not an interval later
        self._thread: threading.Thread | None = None

    def watch(self, node: int, address: str | None) -> None:
        """Ping `node` at `address` from now on (None: stop pinging it)."""
        with self._lock:
            if address is None:
                self._targets.pop(node, None)
            elif self._targets.get(node) != address:
                self._targets[node] = address
                self._wake.set()

    def poke(self) -> None:
        """Ping every watched node now (a refused status probe wants the second opinion)."""
        self._wake.set()

    def drain(self) -> list[Heard]:
        """The outcomes that arrived since the last call, oldest first."""
        with self._lock:
            out, self._heard = self._heard, []
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="coord-pinger", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
            self._thread = None
        for channel, _ in self._channels.values():
            channel.close()
        self._channels.clear()

    def _call(self, address: str) -> grpc.UnaryUnaryMultiCallable:
        entry = self._channels.get(address)
        if entry is None:
            channel = make_sync_channel(address, self._config, own_connection=True)
            call = channel.unary_unary(
                _PING,
                request_serializer=wire_pb2.PingRequest.SerializeToString,
                response_deserializer=wire_pb2.PingResponse.FromString,
            )
            entry = self._channels[address] = (channel, call)
        return entry[1]

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            with self._lock:
                targets = {n: a for n, a in self._targets.items() if n not in self._pending}
                self._pending |= set(targets)
                wanted = set(self._targets.values())
                stale = (set(self._channels) - wanted) | (self._redial & set(self._channels))
                self._redial.clear()
            for address in stale:  # a node moved or left, or its connection went dead
                self._channels.pop(address)[0].close()
            for node, address in sorted(targets.items()):
                future = self._call(address).future(
                    wire_pb2.PingRequest(), timeout=DEADLINE_INTERVALS * self.interval
                )
                future.add_done_callback(partial(self._done, node))
            self._wake.wait(max(0.0, self.interval - (self._clock() - started)))
            self._wake.clear()

    def _done(self, node: int, future: grpc.Future) -> None:
        ok = gone = False
        if future.cancelled():
            pass
        elif (error := future.exception()) is None:
            answer: wire_pb2.PingResponse = future.result()
            ok = answer.server_id in (0, node) and answer.loop_stall_ms <= self.max_stall_ms
        else:
            gone = isinstance(error, grpc.RpcError) and refused(str(error.details()))
        with self._lock:
            self._pending.discard(node)
            self._heard.append(Heard(node, ok, self._clock(), gone))
            failed = self._failed[node] = 0 if ok or gone else self._failed.get(node, 0) + 1
            if failed >= REDIAL_AFTER and node in self._targets:
                self._redial.add(self._targets[node])
