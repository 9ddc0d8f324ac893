"""A limit on everything: the node's bounds on what callers may hold, and their bookkeeping.

Each limit has a name (the `limit` label of `streamwal_limit_exceeded_total` and of
`streamwal_limit`, the configured value), a flag of `streamwal node` and a default
(NodeConfig); docs/limits.md is the table. A caller over a capacity limit gets
RESOURCE_EXHAUSTED naming it (`LimitExceeded`); a producer over its in-flight bounds is
slowed instead (the node stops reading its stream). Pure bookkeeping: the drivers
(node/produce_port.py, node/grpc_limits.py, node/produce_stream.py) apply it.
"""

from __future__ import annotations

from collections import Counter

from streamwal.errors import ResourceExhausted
from streamwal.node.config import NodeConfig

# limit name -> the `streamwal node` flag that sets it
FLAGS = {
    "connections": "--max-connections",
    "connections_per_peer": "--max-connections-per-peer",
    "streams": "--max-streams",
    "streams_per_connection": "--max-streams-per-connection",
    "header_timeout": "--header-timeout",
    "idle_timeout": "--idle-timeout",
    "frame_size": "--max-frame-size",
    "receive_buffer": "--max-receive-buffer",
    "producer_window": "--producer-window",
    "pending_answers": "--max-pending-answers",
    "txns": "--txn-max-open",
    "txns_per_stream": "--txn-max-open-per-stream",
}


def configured(cfg: NodeConfig) -> dict[str, float]:
    """Every limit's value (counts, bytes, seconds), exported as `streamwal_limit`."""
    return {
        "connections": cfg.max_connections,
        "connections_per_peer": cfg.max_connections_per_peer,
        "streams": cfg.max_streams,
        "streams_per_connection": cfg.max_streams_per_connection,
        "header_timeout": cfg.header_timeout_s,
        "idle_timeout": cfg.idle_timeout_s,
        "frame_size": cfg.max_frame_bytes,
        "receive_buffer": cfg.max_receive_buffer_bytes,
        "producer_window": cfg.max_inflight_bytes_per_producer,
        "pending_answers": cfg.max_pending_answers,
        "txns": cfg.txn_max_open,
        "txns_per_stream": cfg.txn_max_open_per_stream,
    }


class LimitExceeded(ResourceExhausted):
    """RESOURCE_EXHAUSTED for one of the node's limits; `limit` names it (metrics)."""

    def __init__(self, limit: str, what: str) -> None:
        super().__init__(f"{what} ({FLAGS[limit]})")
        self.limit = limit


class PeerCounts:
    """What one listener holds (connections, or calls), in total and per peer address."""

    def __init__(
        self, max_total: int, max_per_peer: int, total: str, per_peer: str, what: str
    ) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._limits = (total, per_peer)
        self._what = what
        self.total = 0
        self._per_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> None:
        """Count one more for `peer`, or raise LimitExceeded (nothing counted)."""
        if self.total >= self.max_total:
            raise LimitExceeded(
                self._limits[0], f"the node holds {self.total} {self._what}, its limit"
            )
        if self._per_peer[peer] >= self.max_per_peer:
            raise LimitExceeded(
                self._limits[1],
                f"{peer} holds {self._per_peer[peer]} {self._what} to this node, the limit "
                "per peer address",
            )
        self.total += 1
        self._per_peer[peer] += 1

    def release(self, peer: str) -> None:
        self.total -= 1
        drop(self._per_peer, peer)


def drop(counts: Counter[str], key: str) -> bool:
    """One less for `key`, forgotten at zero (a counter per peer must not grow without
    bound); True when it reached zero."""
    left = counts[key] - 1
    if left:
        counts[key] = left
        return False
    del counts[key]
    return True


class ReceiveBuffer:
    """Bytes of produce-port frames that arrived only in part, all connections together.

    Charged with what is actually held, not what a frame claims, so headers alone cannot
    fill it; a connection whose frame would take it over its limit is refused.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def resize(self, held: int, now: int) -> bool:
        """A connection's charge goes from `held` to `now` bytes; False when that is over
        the limit (the charge is then `held`: the caller refuses the frame)."""
        if now > held and self.used + now - held > self.limit:
            return False
        self.used += now - held
        return True
