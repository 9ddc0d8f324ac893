"""Producers and consumers that follow a pchannel from node to node.

`Router` turns the watcher's assignment into node connections (one gRPC channel per node
address, shared). A `RoutedProducer` writes through a resendable, idempotent node
producer, and moves it when that breaks -- the pchannel was fenced or moved
(CHANNEL_FENCED, CHANNEL_NOT_EXIST, UNMATCHED_CHANNEL_TERM), its node is unreachable, or
its node stopped answering within the producer's bounds (request deadline, keepalive) --
or as soon as the coord assigns the pchannel under a newer term (a paused owner answers
nothing and breaks nothing: only the assignment says it was replaced). A move detaches
every unacknowledged batch, opens a producer with the *same producer id* on the owner
of the newest assignment (waiting for one, bounded), and hands the batches to it,
oldest first, with the sequence numbers they had (`detach_unacknowledged` / `adopt`).
Batches the old owner had already stored reached the new owner through the coord's
catch-up or replication, so the node answers them with their original result instead of
appending them again: no duplicates, per-producer order kept, and the caller's `send()`
simply returns later.

A `RoutedConsumer` remembers the last offset it delivered and, on the same errors,
reopens on the new owner just after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

import grpc

from streamwal.client.consumed import ConsumedMessage
from streamwal.client.discovery import AssignmentWatcher, NoRoute, Route
from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.client.produce_ledger import Op
from streamwal.client.producer import Appended, AppendedBatch, Producer, fail_ops
from streamwal.client.txn import Txn
from streamwal.errors import OnShutdown, StreamingError, Unavailable, is_fencing_error
from streamwal.transport import Replaced, TransportConfig

log = logging.getLogger("streamwal.client.routing")

T = TypeVar("T")
RETRY_INTERVAL = 0.25  # how long to wait for a newer assignment before retrying the same one
# A pchannel without an owner in the coord's assignment this long: ask the coord whether
# one can come at all, then again after twice as long, up to ASK_COORD_MAX apart. One that
# lost acknowledged records, or was destroyed, fails the wait at once with the coord's
# reason instead of after `failover_timeout`. Only while it has no owner at all: a wait
# on an assigned owner (a move under way, a grace period) asks nothing, so a failover of
# many pchannels under many clients does not add describe calls to the coord's work.
ASK_COORD_AFTER = 1.0
ASK_COORD_MAX = 5.0
_SUPERSEDED = object()  # an open attempt given up for a newer assignment


def is_retryable(err: BaseException) -> bool:
    """Errors that mean "look the owner up again": fencing, unreachable, shutting down."""
    return isinstance(err, Unavailable | OnShutdown) or (
        isinstance(err, StreamingError) and is_fencing_error(err)
    )


@dataclass(frozen=True)
class Reroute:
    """One move of a producer: from which route to which, when (monotonic), what it resent."""

    old: Route | None
    new: Route
    started: float
    finished: float
    resent: int

    @property
    def seconds(self) -> float:
        return self.finished - self.started


class Router:
    """Routes pchannels to their owners; the one place that retries under a deadline."""

    def __init__(
        self,
        watcher: AssignmentWatcher,
        transport: TransportConfig | None = None,
        failover_timeout: float = 30.0,
    ) -> None:
        self.watcher = watcher
        self.failover_timeout = failover_timeout
        self._transport = transport
        self._clients: dict[str, NodeClient] = {}
        self._replaced = Replaced()
        self._closed = False

    def client(self, address: str) -> NodeClient:
        nc = self._clients.get(address)
        if nc is None:
            nc = self._clients[address] = NodeClient(address, self._transport)
        return nc

    async def reopen(
        self,
        pchannel: str,
        failed: Route | None,
        err: StreamingError | None,
        open_at: Callable[[Route], Awaitable[T]],
    ) -> tuple[Route, T]:
        """Call `open_at(route)` on the current owner until it works; returns (route, result).

        `failed`/`err`: the route that just failed (reported to the coord, and a newer
        route is preferred). Non-retryable errors propagate; so does the coord's refusal
        (DataLoss, ChannelNotExist: `AssignmentWatcher.refusal`), asked while the
        pchannel has no owner (ASK_COORD_AFTER); NoRoute after the deadline.
        """
        deadline = time.monotonic() + self.failover_timeout
        ask_every = ASK_COORD_AFTER
        ask_coord_at = time.monotonic() + ask_every
        last_err = err
        route = failed
        while True:
            if self._closed:  # (its producers end with their node clients: fail, not move)
                raise Unavailable(f"pchannel {pchannel!r}: the client was closed")
            if route is not None and last_err is not None:
                self.watcher.report_error(route, last_err)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoRoute(
                    f"pchannel {pchannel!r}: no working owner within "
                    f"{self.failover_timeout:.1f}s (last error: {last_err})"
                )
            if time.monotonic() >= ask_coord_at:
                if self.watcher.route(pchannel) is None:
                    refusal = await self.watcher.refusal(pchannel, min(2.0, remaining))
                    if refusal is not None:
                        raise refusal
                    ask_every = min(2 * ask_every, ASK_COORD_MAX)
                ask_coord_at = time.monotonic() + ask_every
                continue  # the deadline is looked at again first
            try:
                # Prefer a newer assignment; after a short wait retry the current one
                # (an unreachable node may be back, a restarted one re-assigned).
                wait = remaining if route is None else min(RETRY_INTERVAL, remaining)
                wait = min(wait, max(0.0, ask_coord_at - time.monotonic()))
                candidate = await self.watcher.wait_route(pchannel, route, wait)
            except NoRoute:
                candidate = self.watcher.route(pchannel)
                if candidate is None:
                    continue  # raises at the top once the deadline passed
            try:
                opened = await self._attempt(pchannel, candidate, open_at, max(0.1, remaining))
                if opened is not _SUPERSEDED:
                    return candidate, opened  # type: ignore[return-value]
                route, last_err = candidate, None  # a newer owner is known: go there now
                continue
            except TimeoutError:
                last_err = Unavailable(f"node {candidate.address} did not answer")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled ourselves
                last_err = Unavailable(f"call to node {candidate.address} was cancelled")
            except StreamingError as exc:
                if not is_retryable(exc):
                    raise
                last_err = exc
            if isinstance(last_err, Unavailable):
                await self.forget(candidate.address)
            route = candidate
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    async def _attempt(
        self,
        pchannel: str,
        candidate: Route,
        open_at: Callable[[Route], Awaitable[T]],
        timeout: float,
    ) -> T | object:
        """`open_at(candidate)`, given up after `timeout` (TimeoutError) or as soon as the
        coord names a newer owner (returns _SUPERSEDED): a paused node never answers, and
        the move away from it must not wait for that."""
        opening = asyncio.ensure_future(open_at(candidate))
        newer = asyncio.ensure_future(self.watcher.wait_route(pchannel, candidate, None))
        try:
            done, _ = await asyncio.wait(
                (opening, newer), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            newer.cancel()
            if not opening.done():
                opening.cancel()  # what it opened so far it closes itself
                await asyncio.gather(opening, return_exceptions=True)
        if opening in done:
            return opening.result()
        if newer in done:
            return _SUPERSEDED
        raise TimeoutError

    async def forget(self, address: str) -> None:
        """Replace the connection to a node that cannot be reached (TRANSIENT_FAILURE):
        a fresh channel connects at once, not after gRPC's reconnect backoff. A connected
        channel is kept (other streams use it); a replaced one lingers for the calls that
        may still run on it (`transport.Replaced`)."""
        nc = self._clients.get(address)
        if nc is None:
            return
        channel = nc._channel  # NodeClient has no public accessor for its channel state
        if channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        now = time.monotonic()
        if self._replaced.due(address, now):
            await self._replaced.retire(self._clients.pop(address), now)

    async def close(self) -> None:
        self._closed = True
        for nc in self._clients.values():
            await nc.close()
        self._clients.clear()
        await self._replaced.close()


class RoutedProducer:
    """Appends to one pchannel wherever it is served; sends survive moves and failovers.

    Options are the node producer's (`Producer`: batching, `ack_level`, the liveness
    bounds `request_timeout`, `keepalive_interval`, `keepalive_timeout`); the wait for a
    new owner is the router's `failover_timeout`.
    """

    def __init__(
        self,
        router: Router,
        pchannel: str,
        *,
        producer_id: str | None = None,
        vchannel: str | None = None,
        **options,
    ) -> None:
        self.router = router
        self.pchannel = pchannel
        self.vchannel = vchannel
        self.producer_id = producer_id or uuid.uuid4().hex
        self._options = options
        self._inner: Producer | None = None
        self.route: Route | None = None
        self._settled = asyncio.Event()
        self._watch: asyncio.Task | None = None
        self._error: StreamingError | None = None  # sends fail with it (set once for good)
        self._refusal: StreamingError | None = None  # new sends fail with it (closing)
        self._pending: list[Op] = []  # detached during a move, until the new owner adopts
        self._outstanding = 0  # sends not yet answered (across failovers)
        self._idle = asyncio.Event()
        self._idle.set()
        self.reroutes: list[Reroute] = []

    async def _open_at(self, route: Route) -> Producer:
        return await self.router.client(route.address).producer(
            self.pchannel,
            route.term,
            producer_id=self.producer_id,
            resendable=True,
            **self._options,
        )

    async def open(self) -> RoutedProducer:
        self.route, self._inner = await self.router.reopen(self.pchannel, None, None, self._open_at)
        self._settled.set()
        self._watch = asyncio.create_task(self._supervise(), name=f"route-{self.pchannel}")
        return self

    async def __aenter__(self) -> RoutedProducer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _ready(self) -> Producer:
        """The producer to send on; during a move, waits until the supervisor has handed
        the pending sends to the new one.

        Waiters queue on one Event, which wakes them in the order they came, so sends keep
        their order across a failover. (Polling here instead let a send that arrived
        before the supervisor noticed the break be overtaken by later ones.)
        """
        while True:
            if self._error is not None:
                raise self._error
            inner = self._inner
            if inner is not None and self._settled.is_set() and not inner.broken.is_set():
                return inner
            if inner is not None and inner.broken.is_set():
                self._settled.clear()  # the supervisor takes over and sets it again
            await self._settled.wait()

    async def _through(self, use: Callable[[Producer], Awaitable[T]]) -> T:
        """`use(current producer)`, counted as outstanding from the call on (`close`
        waits for it). `use` must reach the producer without awaiting first: then no move
        can slip in between (a coroutine runs to its first await at once)."""
        if self._refusal is not None:
            raise self._refusal
        self._outstanding += 1
        self._idle.clear()
        try:
            return await use(await self._ready())
        finally:
            self._outstanding -= 1
            if not self._outstanding:
                self._idle.set()

    async def send(
        self,
        payload: bytes,
        *,
        vchannel: str | None = None,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> Appended:
        """Append one message; returns once it is durable on the pchannel's owner."""
        vchannel = vchannel or self.vchannel
        return await self._through(
            lambda p: p.send(payload, vchannel=vchannel, msg_type=msg_type, properties=properties)
        )

    async def send_many(self, payloads: Sequence[bytes], **kwargs) -> AppendedBatch:
        """Append all payloads as one atomic batch."""
        kwargs.setdefault("vchannel", self.vchannel)
        return await self._through(lambda p: p.send_many(payloads, **kwargs))

    async def begin_txn(self, vchannel: str | None = None, keepalive: float | None = None) -> Txn:
        """A transaction on the current owner. It does not follow a move: only committed
        data survives one (see client/txn.py)."""
        inner = await self._ready()
        return await inner.begin_txn(vchannel or self.vchannel or self.pchannel, keepalive)

    async def send_batch(self, entries: list[bytes], barrier_time_tick: int = 0) -> tuple[int, int]:
        """Append pre-encoded entries (`encoding.encode_entry`, each with its own vchannel,
        type and properties) as one atomic batch: (first offset, first tick)."""
        return await self._through(lambda p: p.send_batch(entries, barrier_time_tick))

    async def _trouble(self, inner: Producer, route: Route) -> tuple[StreamingError, bool]:
        """Wait until `inner` breaks or the coord assigns the pchannel under a newer term:
        (why, whether it moved)."""
        broken = asyncio.ensure_future(inner.broken.wait())
        newer = asyncio.ensure_future(self.router.watcher.wait_route(self.pchannel, route, None))
        try:
            await asyncio.wait((broken, newer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            broken.cancel()
            newer.cancel()
        if inner.broken.is_set():
            return inner.error or Unavailable("producer stream broke"), False
        new = newer.result()
        return Unavailable(
            f"pchannel {self.pchannel!r} moved from node {route.server_id} (term {route.term}) "
            f"to node {new.server_id} (term {new.term})"
        ), True

    async def _supervise(self) -> None:
        while True:
            inner, old = self._inner, self.route
            assert inner is not None and old is not None
            err, moved = await self._trouble(inner, old)
            self._settled.clear()
            self._pending = inner.detach_unacknowledged()
            next_sequence = inner.next_sequence
            await inner.abandon()
            started = time.monotonic()
            if not is_retryable(err):
                self._fail(err)
                return
            log.info(
                "producer rerouting",
                extra={"pchannel": self.pchannel, "error": str(err), "pending": len(self._pending)},
            )
            try:
                # A move is no error to report: the coord made it.
                self.route, self._inner = await self.router.reopen(
                    self.pchannel, old, None if moved else err, self._open_at
                )
            except StreamingError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # never leave sends hanging on a bug
                log.exception("rerouting failed", extra={"pchannel": self.pchannel})
                self._fail(Unavailable(f"rerouting failed: {exc!r}"))
                return
            pending, self._pending = self._pending, []
            self._inner.adopt(pending, next_sequence)
            self.reroutes.append(Reroute(old, self.route, started, time.monotonic(), len(pending)))
            log.info(
                "producer rerouted",
                extra={
                    "pchannel": self.pchannel,
                    "from": f"{old.server_id}@{old.term}",
                    "to": f"{self.route.server_id}@{self.route.term}",
                    "resent": len(pending),
                },
            )
            self._settled.set()

    def _fail(self, err: StreamingError) -> None:
        """The producer is over: sends waiting for a move, and those detached, fail."""
        self._error = self._error or err
        pending, self._pending = self._pending, []
        fail_ops(pending, err)
        self._settled.set()

    async def close(self, timeout: float | None = None) -> None:
        """Wait for every outstanding send (across failovers), then close; sends after
        this call are refused.

        The wait is at most `timeout` seconds (None: twice the router's failover_timeout,
        the most two moves in a row may take); sends still unanswered then fail with
        Unavailable.
        """
        self._refusal = self._refusal or Unavailable(f"producer of {self.pchannel!r} closed")
        limit = self.router.failover_timeout * 2 if timeout is None else timeout
        with suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), limit)
        if self._watch is not None:
            self._watch.cancel()
            with suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        late = Unavailable(f"producer of {self.pchannel!r} closed before its sends were answered")
        self._fail(late)
        inner = self._inner
        if inner is not None:
            graceful = self._idle.is_set() and not inner.broken.is_set()
            if not graceful:
                fail_ops(inner.detach_unacknowledged(), late)
            await inner.abandon(graceful=graceful)


class RoutedConsumer:
    """Reads one pchannel wherever it is served, resuming after the last delivered offset."""

    def __init__(
        self,
        router: Router,
        pchannel: str,
        policy: DeliverPolicy | None = None,
        filters: Sequence[DeliverFilter] = (),
        *,
        time_ticks: bool = False,
        end_offset: int | None = None,
    ) -> None:
        self.router = router
        self.pchannel = pchannel
        self._policy = policy or DeliverPolicy.all()
        self._filters = list(filters)
        self._time_ticks = time_ticks
        self.end_offset = end_offset
        self.last_offset: int | None = None
        self.route: Route | None = None
        self._inner = None
        self._buffer: list[ConsumedMessage] = []
        self.reopens = 0

    async def _open_at(self, route: Route):
        last = self.last_offset
        policy = self._policy if last is None else DeliverPolicy.start_after(last)
        return await self.router.client(route.address).consumer(
            self.pchannel,
            route.term,
            policy,
            self._filters,
            time_ticks=self._time_ticks,
            end_offset=self.end_offset,
        )

    async def open(self) -> RoutedConsumer:
        self.route, self._inner = await self.router.reopen(self.pchannel, None, None, self._open_at)
        return self

    def __aiter__(self) -> RoutedConsumer:
        return self

    async def __anext__(self) -> ConsumedMessage:
        while True:
            batch = await self.next_batch()
            if batch is None:
                raise StopAsyncIteration
            if batch:
                self._buffer = batch[1:]
                return batch[0]

    async def next_batch(self) -> list[ConsumedMessage] | None:
        """The next messages, in offset order, never one at or below the last delivered."""
        if self._buffer:
            out, self._buffer = self._buffer, []
            return out
        while True:
            if self._done():
                return None
            err: StreamingError
            try:
                batch = await self._inner.next_batch()
                if batch is None:
                    return None  # a clean end: end_offset reached, or the node closed it
                last = self.last_offset
                fresh = [m for m in batch if last is None or m.offset > last]
                if fresh:
                    self.last_offset = fresh[-1].offset
                return fresh
            except StreamingError as exc:
                if not is_retryable(exc):
                    raise
                err = exc
            await self._inner.close()
            self.reopens += 1
            self.route, self._inner = await self.router.reopen(
                self.pchannel, self.route, err, self._open_at
            )

    def _done(self) -> bool:
        return (
            self.end_offset is not None
            and self.last_offset is not None
            and self.last_offset + 1 >= self.end_offset
        )

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()
            self._inner = None

    async def __aenter__(self) -> RoutedConsumer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
