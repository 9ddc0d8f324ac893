"""What a producer accepted, what is on the wire, and what it still owes an answer.

The pure bookkeeping of one producer stream (no asyncio, clock, sockets or protobuf),
after aiokafka's MessageAccumulator and the sequence numbers of its TransactionManager.
The loop in client/producer.py feeds it events and applies what it hands back:

- `add` (one message), `add_batch` (an atomic batch) and `add_txn` (a txn operation)
  accept an op and queue it in the order of the calls. A message joins the last queued
  batch while that batch is open: not on the wire yet, under the size limits, and
  nothing queued after it. So concurrent sends share a frame, and a send never lands
  ahead of a batch or txn operation accepted before it.
- `dispatch(now)` takes the oldest queued op when an in-flight slot is free. It closes
  the op, numbers it (an idempotent producer's batches and txn commits take the next
  sequence; a resent or pinned op keeps its own), gives it a request id and notes when it
  left, for the request deadline (`oldest_sent_at`).
- `settle(request_id)` takes the answered op off the wire and frees its slot; the loop
  resolves the op's waiter. None for an id the ledger no longer holds (answered after a
  `detach`).
- `fail_all()` ends the ledger when the stream is gone and nobody resends: every op
  still owed an answer, for the loop to fail.
- `detach()` ends the ledger for a resend elsewhere: the unanswered ops in the order they
  were accepted, and apart the txn operations that cannot follow (begin, append, rollback,
  and a commit never sent: a txn lives on its node). `adopt(ops, next_sequence)` queues
  them on a fresh ledger ahead of anything new.

Invariants (asserted):
- an op is answered once: QUEUED -> IN_FLIGHT -> DONE, or -> DETACHED -> QUEUED on the
  adopting ledger; `settle` takes only an op in flight, and only once;
- sequence numbers only grow: every number the ledger gives is above every number it gave,
  adopted or learned from the node (`next_sequence` never goes down), and a resent op keeps
  its number, so the node answers it instead of appending it again;
- order per producer: ops leave in the order they were accepted, and resent ops leave
  ahead of newer ones, in their original order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

QUEUED = "queued"
IN_FLIGHT = "in flight"
DONE = "done"
DETACHED = "detached"


class Op:
    """Something the producer accepted and owes an answer for.

    `waiter` belongs to the loop (its future); the ledger never looks at it. `numbered`:
    whether it takes a sequence number (it appends)."""

    __slots__ = ("request_id", "sent_at", "sequence", "state", "waiter")
    numbered = True

    def __init__(self) -> None:
        self.state = QUEUED
        self.sequence = 0  # 0: none yet (or never, for a producer without idempotence)
        self.request_id = 0
        self.sent_at = 0.0
        self.waiter: Any = None


class Batch(Op):
    """Messages appended atomically, as one frame."""

    __slots__ = ("barrier", "count", "entries", "size")

    def __init__(self, entries: list[bytes] | None = None, barrier: int = 0) -> None:
        super().__init__()
        self.entries: list[bytes] = entries if entries is not None else []
        self.count = len(self.entries)
        self.size = 0  # bytes, counted for batches that sends join (`add`)
        self.barrier = barrier  # every tick of the batch must be above it (0: none)


class TxnOp(Op):
    """A txn operation, ordered with the batches. Only a commit appends (and is numbered);
    `request` is the loop's (a TxnRequest)."""

    __slots__ = ("commit", "numbered", "request")

    def __init__(self, request: Any, commit: bool) -> None:
        super().__init__()
        self.request = request
        self.commit = commit
        self.numbered = commit


class ProduceLedger:
    """The ops of one producer stream; see the module docstring."""

    def __init__(
        self,
        *,
        idempotent: bool,
        max_in_flight: int,
        max_batch_bytes: int,
        max_batch_messages: int,
    ) -> None:
        if max_in_flight < 1 or max_batch_bytes < 1 or max_batch_messages < 1:
            raise ValueError("max_in_flight, max_batch_bytes and max_batch_messages must be >= 1")
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_messages = max_batch_messages
        self.next_sequence = 1
        self.ended = False  # after fail_all / detach: nothing more is accepted or sent
        self._queue: deque[Op] = deque()
        self._open: Batch | None = None  # the last queued batch, while sends may join it
        self._in_flight: dict[int, Op] = {}  # by request id, in the order they left
        self._next_request_id = 1

    # -- what the loop asks --------------------------------------------------------------

    @property
    def quiet(self) -> bool:
        """Nothing queued and nothing on the wire."""
        return not self._queue and not self._in_flight

    @property
    def has_queued(self) -> bool:
        return bool(self._queue)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def can_dispatch(self) -> bool:
        return bool(self._queue) and len(self._in_flight) < self.max_in_flight

    def alone(self, op: Op) -> bool:
        """Whether `op` is all the ledger holds (a lone send may go out at once)."""
        return not self._in_flight and len(self._queue) == 1 and self._queue[0] is op

    def oldest_sent_at(self) -> float | None:
        """When the oldest unanswered op left (None: nothing on the wire)."""
        for op in self._in_flight.values():
            return op.sent_at
        return None

    # -- accepting -----------------------------------------------------------------------

    def add(self, entry: bytes) -> tuple[Batch, int]:
        """Accept one encoded message: (its batch, its index in the batch)."""
        assert not self.ended, "the ledger ended"
        batch = self._open
        if (
            batch is None
            or batch.size + len(entry) > self.max_batch_bytes
            or batch.count >= self.max_batch_messages
        ):
            batch = self._open = Batch()
            self._queue.append(batch)
        index = batch.count
        batch.entries.append(entry)
        batch.size += len(entry)
        batch.count += 1
        return batch, index

    def add_batch(self, entries: list[bytes], barrier: int = 0, sequence: int = 0) -> Batch:
        """Accept an atomic batch; `sequence` pins its number (0: the next one)."""
        assert not self.ended, "the ledger ended"
        if sequence and not self.idempotent:
            raise ValueError("a pinned sequence needs an idempotent producer")
        batch = Batch(entries, barrier)
        if sequence:
            batch.sequence = sequence
            self.next_sequence = max(self.next_sequence, sequence + 1)
        self._queue.append(batch)
        self._open = None  # later sends go after it
        return batch

    def add_txn(self, request: Any, commit: bool) -> TxnOp:
        """Accept a txn operation (`commit`: it appends, and takes a sequence number)."""
        assert not self.ended, "the ledger ended"
        op = TxnOp(request, commit)
        self._queue.append(op)
        self._open = None
        return op

    def learn_last_sequence(self, last: int) -> None:
        """The node's last accepted sequence for this producer id (its `create` answer)."""
        self.next_sequence = max(self.next_sequence, last + 1)

    # -- sending and answers -------------------------------------------------------------

    def dispatch(self, now: float) -> Op | None:
        """The next op to write (numbered, with its request id), or None when nothing is
        queued or every slot is taken."""
        if self.ended or not self._queue or len(self._in_flight) >= self.max_in_flight:
            return None
        op = self._queue.popleft()
        if op is self._open:
            self._open = None
        assert op.state == QUEUED, op.state
        if self.idempotent and op.numbered:
            if op.sequence:  # resent or pinned: keeps its number
                assert op.sequence < self.next_sequence
            else:
                op.sequence = self.next_sequence
                self.next_sequence += 1
        op.request_id = self._next_request_id
        self._next_request_id += 1
        op.sent_at = now
        op.state = IN_FLIGHT
        self._in_flight[op.request_id] = op
        return op

    def settle(self, request_id: int) -> Op | None:
        """The op answered under `request_id` (its slot is free again); None if the ledger
        no longer holds it."""
        op = self._in_flight.pop(request_id, None)
        if op is None:
            return None
        assert op.state == IN_FLIGHT, op.state
        op.state = DONE
        return op

    # -- the end of the stream -----------------------------------------------------------

    def fail_all(self) -> list[Op]:
        """End the ledger: every op still owed an answer (on the wire first, then queued)."""
        owed = [*self._in_flight.values(), *self._queue]
        self._end()
        for op in owed:
            assert op.state in (QUEUED, IN_FLIGHT), op.state
            op.state = DONE
        return owed

    def detach(self) -> tuple[list[Op], list[Op]]:
        """End the ledger for a resend on another stream: (ops to resend, in the order they
        were accepted; txn ops that cannot follow, now DONE for the loop to fail)."""
        assert self.idempotent, "only an idempotent producer may resend"
        resend: list[Op] = []
        lost: list[Op] = []
        for op in [*self._in_flight.values(), *self._queue]:
            if isinstance(op, TxnOp) and (not op.commit or op.state == QUEUED):
                op.state = DONE
                lost.append(op)
            else:
                op.state = DETACHED
                resend.append(op)
        self._end()
        return resend, lost

    def adopt(self, ops: Iterable[Op], next_sequence: int = 1) -> None:
        """Queue `ops` (from `detach` of this producer's previous stream) ahead of anything
        new; numbers given from now on are above theirs and below none of `next_sequence`."""
        assert not self.ended, "the ledger ended"
        assert not self._in_flight, "adopting behind ops already sent would reorder them"
        adopted = list(ops)
        for op in adopted:
            assert op.state == DETACHED, op.state
            op.state = QUEUED
            if op.sequence:
                self.next_sequence = max(self.next_sequence, op.sequence + 1)
        self.next_sequence = max(self.next_sequence, next_sequence)
        self._queue.extendleft(reversed(adopted))

    def _end(self) -> None:
        self.ended = True
        self._in_flight.clear()
        self._queue.clear()
        self._open = None
