"""Open transactions of a node: their buffered messages, keepalive expiry and limits.

A txn lives only in the node's memory until its commit appends the buffer as one record
(node/txn_ops.py), so a restart, a term change or the end of the producer stream that
began it loses it, and only committed data survives. Pure bookkeeping: the caller passes
the time, which keeps expiry testable without sleeping. Memory is bounded by
`max_open` txns (at most `max_per_owner` of one producer stream) of at most `max_bytes`
each; expired txns are swept lazily (on each operation and each begin), so no timer
task is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from streamwal.errors import (
    InvalidArgument,
    InvalidTransactionState,
    StreamingError,
    TransactionExpired,
)
from streamwal.node.limits import LimitExceeded

_REMEMBERED = 4096  # closed txns whose fate is remembered for a clear error


@dataclass(frozen=True)
class TxnLimits:
    keepalive_s: float = 10.0  # default keepalive: expire after this long without an append
    max_keepalive_s: float = 600.0  # the longest keepalive a txn may ask for
    max_bytes: int = 16 * 1024 * 1024  # buffered message bytes per txn
    max_open: int = 1024  # open txns per node
    max_per_owner: int = 64  # open txns per producer stream


@dataclass
class OpenTxn:
    txn_id: int
    owner: object  # the produce stream that began it: no other stream may use it
    pchannel: str
    term: int
    vchannel: str
    keepalive_s: float
    deadline: float
    parts: list[bytes] = field(default_factory=list)  # serialized MessageBatch pieces
    count: int = 0
    size: int = 0

    @property
    def body(self) -> bytes:
        """One MessageBatch of every appended message (repeated fields concatenate)."""
        return b"".join(self.parts)


class TxnTable:
    def __init__(self, limits: TxnLimits, on_close: Callable[[str], None] | None = None) -> None:
        """`on_close(outcome)` hears how each txn ended: committed, rolled_back, expired,
        lost or refused (for metrics)."""
        self.limits = limits
        self._on_close = on_close
        self._open: dict[int, OpenTxn] = {}
        self._closed: OrderedDict[int, str] = OrderedDict()  # txn id -> why it ended
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._open)

    def begin(
        self,
        owner: object,
        pchannel: str,
        term: int,
        vchannel: str,
        keepalive_s: float | None,
        now: float,
    ) -> OpenTxn:
        """A new txn; `keepalive_s` None or 0 takes the node's default."""
        if keepalive_s is not None and keepalive_s < 0:
            raise InvalidArgument(f"txn keepalive must be >= 0 s, got {keepalive_s}")
        if not vchannel:
            raise InvalidArgument("a txn needs a vchannel")
        self.sweep(now)
        if len(self._open) >= self.limits.max_open:
            raise LimitExceeded(
                "txns",
                f"the node holds {len(self._open)} open txns, its limit; retry once some "
                "commit, roll back or expire",
            )
        mine = sum(1 for t in self._open.values() if t.owner is owner)
        if mine >= self.limits.max_per_owner:
            raise LimitExceeded(
                "txns_per_stream",
                f"this producer stream holds {mine} open txns, the limit per stream; commit "
                "or roll back some first",
            )
        keepalive = keepalive_s or self.limits.keepalive_s
        txn = OpenTxn(self._next_id, owner, pchannel, term, vchannel, keepalive, now + keepalive)
        self._next_id += 1
        self._open[txn.txn_id] = txn
        return txn

    def append(self, owner: object, txn_id: int, body: bytes, count: int, now: float) -> OpenTxn:
        """Buffer `count` messages (a serialized MessageBatch); renews the keepalive."""
        txn = self._get(owner, txn_id, now)
        if txn.size + len(body) > self.limits.max_bytes:
            raise InvalidArgument(
                f"txn {txn_id} would hold {txn.size + len(body)} bytes, over the per-txn "
                f"limit of {self.limits.max_bytes} (--txn-max-bytes); the append was refused"
            )
        txn.parts.append(body)
        txn.count += count
        txn.size += len(body)
        txn.deadline = now + txn.keepalive_s
        return txn

    def vchannel_of(self, owner: object, txn_id: int, now: float) -> str:
        return self._get(owner, txn_id, now).vchannel

    def take(self, owner: object, txn_id: int, term: int, now: float) -> OpenTxn:
        """Close the txn for its commit: whatever happens next, it cannot be used again."""
        txn = self._get(owner, txn_id, now)
        del self._open[txn_id]
        if txn.term != term:
            self._remember(
                txn_id, f"lost: begun under term {txn.term}, the pchannel moved on", "lost"
            )
            raise InvalidTransactionState(
                f"txn {txn_id} was begun under term {txn.term} of {txn.pchannel!r}, which is "
                f"now at term {term}: the txn is lost"
            )
        if not txn.count:
            self._remember(txn_id, "committed empty (refused)", "refused")
            raise InvalidArgument(f"txn {txn_id} has no messages: nothing to commit")
        self._remember(txn_id, "committed", "committed")
        return txn

    def rollback(self, owner: object, txn_id: int, now: float) -> OpenTxn:
        txn = self._get(owner, txn_id, now)
        del self._open[txn_id]
        self._remember(txn_id, "rolled back", "rolled_back")
        return txn

    def drop_owner(self, owner: object) -> int:
        """Forget every txn of a produce stream that ended; returns how many."""
        ids = [t.txn_id for t in self._open.values() if t.owner is owner]
        for txn_id in ids:
            del self._open[txn_id]
            self._remember(txn_id, "lost: its producer stream ended", "lost")
        return len(ids)

    def sweep(self, now: float) -> list[OpenTxn]:
        """Expire every txn past its keepalive; returns them."""
        expired = [t for t in self._open.values() if now > t.deadline]
        for txn in expired:
            del self._open[txn.txn_id]
            self._remember(
                txn.txn_id, f"expired: no append within {txn.keepalive_s:g} s", "expired"
            )
        return expired

    def _get(self, owner: object, txn_id: int, now: float) -> OpenTxn:
        txn = self._open.get(txn_id)
        if txn is not None and now > txn.deadline:
            self.sweep(now)
            txn = None
        if txn is None or txn.owner is not owner:
            raise self._gone(txn_id)
        return txn

    def _gone(self, txn_id: int) -> StreamingError:
        why = self._closed.get(txn_id)
        if why is None:
            return InvalidTransactionState(
                f"txn {txn_id} is unknown to this producer stream (never begun on it, or "
                "the node restarted): only committed txns survive"
            )
        if why.startswith("expired"):
            return TransactionExpired(f"txn {txn_id} {why}; it was rolled back")
        return InvalidTransactionState(f"txn {txn_id} is closed ({why})")

    def _remember(self, txn_id: int, why: str, outcome: str) -> None:
        if self._on_close is not None:
            self._on_close(outcome)
        self._closed[txn_id] = why
        while len(self._closed) > _REMEMBERED:
            self._closed.popitem(last=False)
