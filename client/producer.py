"""The producer of one pchannel on one node: a thin loop between the ledger
(client/produce_ledger.py) and one produce call (client/produce_call.py), after the
split of aiokafka's producer into accumulator, sender and transaction manager.

Batching and pipelining: messages sent while earlier batches are in flight gather into
the next batch (up to size limits), with at most `max_in_flight` batches unanswered, as
Kafka's producer does. A lone `send` therefore goes out at once (low latency: on the
produce port it even writes its own frame, without waking the sender task) and many
concurrent sends share frames and fsyncs (high throughput).

Every wait has a bound (client/produce_liveness.py): a request unanswered for
`request_timeout` seconds, or a quiet stream whose node does not answer a keepalive ping
within `keepalive_interval + keepalive_timeout`, counts as dead; opening the stream is one
request. A dead stream fails what the producer owes with Unavailable -- or, for a
`resendable` producer, leaves it for its owner (the routed producer) to resend elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from grpc import aio

from streamwal.client import encoding
from streamwal.client.produce_call import (
    PING,
    ProduceCall,
    open_grpc_call,
    request_parts,
    unavailable,
)
from streamwal.client.produce_ledger import Op, ProduceLedger
from streamwal.client.produce_liveness import PING as PING_DUE
from streamwal.client.produce_liveness import Bounds, Dead, Liveness
from streamwal.client.produce_wire import open_wire_producer
from streamwal.client.txn import Txn
from streamwal.errors import (
    InvalidTransactionState,
    StreamingError,
    Unavailable,
    is_fencing_error,
)
from streamwal.ids import decode_offset
from streamwal.proto import streaming_pb2 as pb

ACK_LEVELS = {
    None: pb.ACK_LEVEL_DEFAULT,
    "default": pb.ACK_LEVEL_DEFAULT,
    "leader": pb.ACK_LEVEL_LEADER,
    "quorum": pb.ACK_LEVEL_QUORUM,
}


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a producer's message landed: its offset and time tick (the node tier; the
    accessor's `Appended` also names the vchannel)."""

    offset: int
    time_tick: int


class AppendedBatch(Sequence[Appended]):
    """Where a batch's messages landed: one `Appended` per message, in order, at
    consecutive offsets and ticks from the first. Each is made when it is read: a list
    of 512 frozen `Appended` cost ~460 ns a message, about a third of a pipelined
    producer's CPU at RF=3 (docs/benchmarks.md), for results most callers never read.
    Indexing, slicing, iteration, `len`, `+` and equality with other sequences of
    `Appended` (a list) behave as a list's would."""

    __slots__ = ("_count", "_offset", "_tick")

    def __init__(self, offset: int, time_tick: int, count: int) -> None:
        self._offset, self._tick, self._count = offset, time_tick, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):  # int -> Appended, slice -> list[Appended]
        if isinstance(index, slice):
            return [Appended(self._offset + i, self._tick + i) for i in range(self._count)[index]]
        i = range(self._count)[index]  # IndexError and negative indices as a list's
        return Appended(self._offset + i, self._tick + i)

    def __iter__(self) -> Iterator[Appended]:
        for i in range(self._count):
            yield Appended(self._offset + i, self._tick + i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self._count and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    def __add__(self, other: Iterable[Appended]) -> list[Appended]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Appended]) -> list[Appended]:
        return [*other, *self]

    __hash__ = None  # type: ignore[assignment]  # a list's is too

    def __repr__(self) -> str:
        return repr(list(self))


def fail_ops(ops: Iterable[Op], err: BaseException) -> None:
    """Fail the waiters of `ops` that are still waiting (a detached producer's, say)."""
    for op in ops:
        waiter = op.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)


class Producer:
    """Appends to one pchannel under one term; see the module docstring for batching.

    Producers are idempotent by default: they name themselves (`producer_id`, random
    unless given) and number their batches, so a batch resent after a broken stream is
    answered by the node instead of appended twice. With `resendable=True` a broken
    stream does not fail the pending sends: the owner (the routing layer) takes them with
    `detach_unacknowledged()` and hands them to a new producer with `adopt()`.

    `idempotent=False` gives that up for latency: the node then keeps no per-producer
    state and persists no result window with each batch (about a quarter of its work per
    one-message batch on a small machine, docs/benchmarks.md), and a batch whose answer
    was lost with a broken stream may be appended twice if the application sends it
    again. Redis's XADD and a NATS publish without a message id give the same guarantee.

    `ack_level` on a replicated pchannel: "quorum" answers once the batch is stored on a
    majority of the replicas (the default with several), "leader" once synced on the leader.

    Liveness bounds, in seconds (docs/api.md, "Producer options"):
    `request_timeout` (10): the longest a request (a batch, a txn operation, opening the
    stream) may go unanswered before the stream counts as dead;
    `keepalive_interval` (5): a stream that heard nothing from its node this long, with
    nothing in flight, pings the node; `keepalive_timeout` (5): a ping unanswered this
    long makes the stream dead. TCP keepalive would not do: the kernel of a paused node
    still answers it.
    """

    def __init__(
        self,
        channel: aio.Channel,
        pchannel: str,
        term: int,
        *,
        producer_id: str | None = None,
        max_batch_bytes: int = 1024 * 1024,
        max_batch_messages: int = 8192,
        max_in_flight: int = 8,
        resendable: bool = False,
        ack_level: str | None = None,
        idempotent: bool = True,
        request_timeout: float = 10.0,
        keepalive_interval: float = 5.0,
        keepalive_timeout: float = 5.0,
    ) -> None:
        if ack_level not in ACK_LEVELS:
            raise ValueError(f"ack_level must be 'leader', 'quorum' or None, not {ack_level!r}")
        if not idempotent and (producer_id is not None or resendable):
            raise ValueError(
                "a producer_id or resendable=True needs an idempotent producer: without one, "
                "a resent batch would be appended twice"
            )
        self.bounds = Bounds(request_timeout, keepalive_interval, keepalive_timeout)
        self._ledger = ProduceLedger(
            idempotent=idempotent,
            max_in_flight=max_in_flight,
            max_batch_bytes=max_batch_bytes,
            max_batch_messages=max_batch_messages,
        )
        self.ack_level = ACK_LEVELS[ack_level]
        self.pchannel = pchannel
        self.term = term
        # The node keeps idempotence state only for a named producer: "" opts out.
        if not idempotent:
            self.producer_id = ""
        else:
            self.producer_id = uuid.uuid4().hex if producer_id is None else producer_id
        self._channel = channel
        self._resendable = resendable
        self._props_cache: dict[tuple, bytes] = {}
        self._error: StreamingError | None = None  # why the stream is over
        self._refusal: StreamingError | None = None  # why new sends are refused
        self.broken = asyncio.Event()  # set when the stream fails or is closed
        self._call: ProduceCall | None = None
        self._direct = False  # a lone send may write its own frame (the produce port)
        self._writing = False  # the sender task awaits a write (the transport is busy)
        self._wake = asyncio.Event()  # the sender task has something to do
        self._ping_due = False
        self._sender: asyncio.Task | None = None
        self._liveness: Liveness | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None  # set by `close` while it waits
        self.last_sequence = 0  # what the node had from this producer id when we opened

    @property
    def request_timeout(self) -> float:
        return self.bounds.request_timeout

    async def open(self, produce_port: tuple[str, int] | None = None) -> None:
        """Open the stream: on the node's produce port at (host, port), else over gRPC.
        Not bounded here: `NodeClient.producer` bounds the whole open by request_timeout."""
        header = pb.CreateProducerRequest(
            pchannel=pb.PChannelInfo(name=self.pchannel, term=self.term),
            producer_id=self.producer_id,
            ack_level=self.ack_level,
        )
        if produce_port is not None:
            call: ProduceCall = await open_wire_producer(*produce_port, header)
        else:
            call = await open_grpc_call(self._channel, header)
        self._call = call
        self._direct = call.can_write_now()
        self.last_sequence = call.create.last_sequence
        self._ledger.learn_last_sequence(self.last_sequence)
        loop = asyncio.get_running_loop()
        self._liveness = Liveness(self.bounds, time.monotonic(), call.create.answers_ping)
        call.listen(self._answered, self._ended)
        self._sender = asyncio.ensure_future(self._send_loop())
        self._watch = loop.call_later(self.bounds.tick, self._check_liveness)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def error(self) -> StreamingError | None:
        return self._error

    @property
    def transport(self) -> str:
        """How this producer reaches its node: "produce port" or "gRPC"."""
        return self._call.transport_name if self._call is not None else "gRPC"

    @property
    def next_sequence(self) -> int:
        """The sequence number the next new batch gets (for a producer that takes over)."""
        return self._ledger.next_sequence

    def _props(self, vchannel, msg_type, properties) -> bytes:
        if vchannel is None and msg_type is None and not properties:
            return b""
        key = (vchannel, msg_type, tuple(sorted(properties.items())) if properties else ())
        blob = self._props_cache.get(key)
        if blob is None:
            props = encoding.message_properties(vchannel, msg_type, properties)
            blob = encoding.encode_properties(props)
            if len(self._props_cache) < 1024:
                self._props_cache[key] = blob
        return blob

    def encode(
        self,
        payload: bytes,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> bytes:
        """One message as `send` would write it (an element of a MessageBatch)."""
        return encoding.encode_entry(payload, self._props(vchannel, msg_type, properties))

    # -- accepting ---------------------------------------------------------------------

    async def send(
        self,
        payload: bytes,
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> Appended:
        """Append one message; returns once it is durable on the node."""
        if self._refusal is not None:
            raise self._refusal
        entry = encoding.encode_entry(payload, self._props(vchannel, msg_type, properties))
        ledger = self._ledger
        batch, index = ledger.add(entry)
        if index == 0:
            waiter = batch.waiter = asyncio.get_running_loop().create_future()
            if (
                self._direct
                and not self._writing
                and ledger.alone(batch)
                and self._call.can_write_now()  # type: ignore[union-attr]
            ):
                # Waking the sender task and then the caller cost a one-at-a-time
                # producer two event-loop turns per message: write the frame here.
                ledger.dispatch(time.monotonic())
                self._call.write_now(request_parts(batch))  # type: ignore[union-attr]
                return Appended(*await waiter)  # its only message: no shield needed
            self._wake.set()
        base, tick = await asyncio.shield(batch.waiter)
        return Appended(base + index, tick + index)

    async def send_many(
        self,
        payloads: Iterable[bytes],
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
        barrier_time_tick: int = 0,
    ) -> AppendedBatch:
        """Append all payloads as one atomic batch (same vchannel, type and properties);
        their ticks are above `barrier_time_tick`. Where each landed, in order."""
        blob = self._props(vchannel, msg_type, properties)
        entries = encoding.encode_entries(payloads, blob)
        if not entries:
            return AppendedBatch(0, 0, 0)
        base, tick = await self.send_batch(entries, barrier_time_tick)
        return AppendedBatch(base, tick, len(entries))

    async def send_batch(
        self, entries: list[bytes], barrier_time_tick: int = 0, sequence: int = 0
    ) -> tuple[int, int]:
        """Append entries made by encoding.encode_entry atomically: (first offset, first tick).
        Every tick of the batch is above `barrier_time_tick` (0: no barrier).

        `sequence` pins the batch's number (0: the next one): a writer that must append a
        batch once across restarts (the coord's broadcaster) names it the same every time.
        """
        if sequence and not self.producer_id:
            raise ValueError("a pinned sequence needs an idempotent producer")
        if self._refusal is not None:
            raise self._refusal
        batch = self._ledger.add_batch(entries, barrier_time_tick, sequence)
        waiter = batch.waiter = asyncio.get_running_loop().create_future()
        self._wake.set()
        return await asyncio.shield(waiter)

    async def begin_txn(self, vchannel: str, keepalive: float | None = None) -> Txn:
        """Begin a transaction on `vchannel` (a vchannel of this producer's pchannel).

        `keepalive` (seconds) is how long the txn may go without an append before the node
        expires it; None uses the node's default (`streamwal node --txn-keepalive`). See
        client/txn.py for append / commit / rollback and their errors.
        """
        keepalive_ms = 0 if keepalive is None else max(1, round(keepalive * 1000))
        resp = await self.txn_request(
            pb.TxnRequest(begin=pb.TxnBegin(vchannel=vchannel, keepalive_ms=keepalive_ms))
        )
        return Txn(self, vchannel, resp.begun.txn_id, resp.begun.keepalive_ms / 1000)

    async def txn_request(self, request: pb.TxnRequest, commit: bool = False) -> pb.TxnResponse:
        """Send a TxnRequest on this producer's stream; the node's answer, or its error."""
        if self._refusal is not None:
            raise self._refusal
        op = self._ledger.add_txn(request, commit)
        waiter = op.waiter = asyncio.get_running_loop().create_future()
        self._wake.set()
        return await asyncio.shield(waiter)

    # -- sending -----------------------------------------------------------------------

    async def _send_loop(self) -> None:
        ledger, call, wake = self._ledger, self._call, self._wake
        assert call is not None
        try:
            while self._error is None:
                if self._ping_due:
                    self._ping_due = False
                    await call.write([PING])
                    continue
                op = ledger.dispatch(time.monotonic())
                if op is None:
                    wake.clear()
                    await wake.wait()
                    continue
                self._writing = True
                try:
                    await call.write(request_parts(op))
                finally:
                    self._writing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._lose(unavailable(exc))

    def _check_liveness(self) -> None:
        """The timer: ping a quiet node, give a silent one up (client/produce_liveness.py)."""
        call, liveness = self._call, self._liveness
        if call is None or liveness is None or self._error is not None:
            return
        now = time.monotonic()
        if call.heard:
            call.heard = False
            liveness.heard(now)
        action = liveness.check(now, self._ledger.oldest_sent_at())
        if isinstance(action, Dead):
            self._lose(
                Unavailable(
                    f"pchannel {self.pchannel!r} (term {self.term}) over {call.transport_name}: "
                    f"{action.reason}"
                )
            )
            call.cancel()
            return
        if action == PING_DUE:
            self._ping_due = True
            self._wake.set()
        self._watch = asyncio.get_running_loop().call_later(self.bounds.tick, self._check_liveness)

    # -- answers -----------------------------------------------------------------------

    def _answered(self, resp: pb.ProduceResponse) -> bool:
        """Settle what `resp` answers; False once the stream is over for this producer."""
        kind = resp.WhichOneof("response")
        if kind == "produce_batch":
            r = resp.produce_batch
        elif kind == "txn":
            r = resp.txn
        else:
            return kind != "close"  # (a pong: the call noted that it heard from the node)
        if r.WhichOneof("response") == "error":
            return self._refused(r.request_id, StreamingError.from_proto(r.error))
        op = self._ledger.settle(r.request_id)
        if op is not None:
            if not op.waiter.done():
                op.waiter.set_result(
                    r
                    if kind == "txn"
                    else (decode_offset(r.result.first_id.id), r.result.first_time_tick)
                )
            self._freed()
        return True

    def _refused(self, request_id: int, err: StreamingError) -> bool:
        """The node refused one request. Fenced or moved: a resendable producer's stream
        is over and the request is resent elsewhere; otherwise only that request fails."""
        if self._resendable and is_fencing_error(err):
            self._lose(err)
            return False
        op = self._ledger.settle(request_id)
        if op is not None:
            fail_ops((op,), err)
            self._freed()
        return True

    def _freed(self) -> None:
        """An answer freed a slot: wake the sender if something waits for one."""
        if self._ledger.has_queued:
            self._wake.set()
        elif self._drained is not None and self._ledger.quiet:
            self._drained.set()

    def _ended(self, err: StreamingError | None) -> None:
        self._lose(err or Unavailable("producer stream closed"))

    def _lose(self, err: StreamingError) -> None:
        """The stream is over: fail what it owes, unless its owner resends it elsewhere."""
        if self._error is None:
            self._error = err
        self._direct = False
        self.broken.set()
        self._wake.set()  # the sender task ends
        if self._drained is not None:
            self._drained.set()
        if not self._resendable:
            self._refusal = self._refusal or self._error
            fail_ops(self._ledger.fail_all(), self._error)

    # -- handing over (the routed producer) ---------------------------------------------

    def detach_unacknowledged(self) -> list[Op]:
        """Every op sent or queued but not answered, in the order it was accepted; this
        producer forgets them and sends nothing more (their waiters stay pending for
        whoever resends them). Txn operations other than a sent commit fail: a txn lives
        on its node."""
        self._error = self._error or Unavailable("producer detached")
        self._refusal = self._refusal or self._error
        self._direct = False
        self._wake.set()
        resend, lost = self._ledger.detach()
        fail_ops(lost, InvalidTransactionState("txn lost: the pchannel moved"))
        return resend

    def adopt(self, ops: list[Op], next_sequence: int = 1) -> None:
        """Send `ops` (detached from a producer with the same id) before anything new;
        new batches are numbered from `next_sequence` on at least (sequence numbers only
        grow across the hand-over)."""
        self._ledger.adopt(ops, next_sequence)
        self._wake.set()

    # -- the end -----------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:
        """Wait for every outstanding message, then close the stream; sends after this
        call are refused.

        The wait ends when everything is answered, when the stream dies (each answer is
        due within `request_timeout`), or after `timeout` seconds if given; whatever is
        still unanswered then fails with Unavailable.
        """
        if self._call is None:
            return
        self._refusal = self._refusal or Unavailable(f"producer of {self.pchannel!r} is closed")
        if self._error is None and not self._ledger.quiet:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        graceful = self._error is None and self._ledger.quiet
        await self._stop(graceful)
        fail_ops(
            self._ledger.fail_all(),
            Unavailable(f"producer of {self.pchannel!r} closed before the node answered"),
        )

    async def abandon(self, graceful: bool = False) -> None:
        """Stop without waiting for outstanding messages (the routing layer's exit). A
        resendable producer keeps them for `detach_unacknowledged`; others fail them."""
        if self._call is None:
            return
        self._refusal = self._refusal or Unavailable(f"producer of {self.pchannel!r} closed")
        await self._stop(graceful)
        if not self._resendable:
            fail_ops(self._ledger.fail_all(), self._error or self._refusal)

    async def _stop(self, graceful: bool) -> None:
        call = self._call
        if call is None:
            return
        self._call = None
        self._direct = False
        if self._watch is not None:
            self._watch.cancel()
        if self._sender is not None:
            self._sender.cancel()
        if graceful:
            await call.close(self.bounds.request_timeout)
        call.cancel()
        self._error = self._error or Unavailable("producer closed")
        self.broken.set()  # an owner waiting on it (the routed producer) learns of the end
