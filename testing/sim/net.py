"""The simulated network: calls between endpoints with delay, loss, partitions and pauses.

An endpoint is the coord (0), a node (1..N) or a client (100+). `call` runs a handler on
the destination as the destination's own task (so a crash of the destination cancels it),
after a request delay, and returns its result after a reply delay; either leg may be lost
(the handler's effects stay, the caller times out) or cut by a partition. A paused
endpoint runs nothing: requests to it wait until it resumes, bounded by the caller's
timeout. Every wait is bounded by that timeout.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from streamwal.errors import Unavailable

T = TypeVar("T")
COORD = 0


class Endpoint(Protocol):
    id: int

    @property
    def up(self) -> bool: ...

    async def awake(self) -> None: ...

    def spawn(self, work: Awaitable[T]) -> asyncio.Task[T]: ...


@dataclass
class Faults:
    """What the nemesis set on the network."""

    delay: tuple[float, float] = (0.0005, 0.003)  # one leg, seconds
    loss: float = 0.0  # probability a leg is lost
    cut: set[frozenset[int]] = field(default_factory=set)  # pairs that cannot talk


class Network:
    def __init__(self, rng: random.Random, faults: Faults) -> None:
        self.rng = rng
        self.faults = faults
        self.endpoints: dict[int, Endpoint] = {}
        self.calls = 0

    def reachable(self, a: int, b: int) -> bool:
        return a == b or frozenset((a, b)) not in self.faults.cut

    def _leg(self, a: int, b: int) -> float | None:
        """The delay of one leg, None when it is lost or cut."""
        if not self.reachable(a, b) or self.rng.random() < self.faults.loss:
            return None
        low, high = self.faults.delay
        return self.rng.uniform(low, high)

    async def call(
        self,
        src: int,
        dst: int,
        handler: Callable[[], Awaitable[T]],
        timeout: float,
        what: str = "call",
    ) -> T:
        """Run `handler` on `dst` and return its result; raises its StreamingError, or
        Unavailable when the call cannot complete within `timeout`. A caller that gives
        up (timeout, cancellation) cancels the handler, as a gRPC deadline does.

        Driven by callbacks on one future: the only task is the handler's, on `dst`
        (issue 24: a task per leg and per deadline was most of a 10,000-pchannel run)."""
        self.calls += 1
        loop = asyncio.get_running_loop()
        call = _Call(loop.create_future(), dst)
        timer = loop.call_later(
            timeout, call.fail, Unavailable(f"{what} {src}->{dst}: no answer within {timeout:.3f}s")
        )
        there = self._leg(src, dst)
        if there is not None:  # else lost: the timeout ends it
            loop.call_later(there, self._arrive, src, call, handler)
        try:
            return await call.done
        finally:
            timer.cancel()
            if call.task is not None:
                call.task.cancel()

    def _arrive(self, src: int, call: _Call, handler: Callable[[], Awaitable[Any]]) -> None:
        """The request reached its destination: run the handler there, as its task."""
        if call.done.done():
            return  # the caller gave up meanwhile
        endpoint = self.endpoints.get(call.dst)
        if endpoint is None or not endpoint.up:
            call.fail(Unavailable(f"connection refused by {call.dst}"))
            return
        call.task = endpoint.spawn(_run(endpoint, handler))
        call.task.add_done_callback(lambda task: self._answer(src, call, task))

    def _answer(self, src: int, call: _Call, task: asyncio.Task) -> None:
        """The handler ended: an error comes back at once, a result after the reply leg."""
        if call.done.done():
            return
        if task.cancelled():
            call.fail(Unavailable(f"{call.dst} went down during the call"))
            return
        error = task.exception()
        if error is not None:
            call.fail(error)
            return
        back = self._leg(call.dst, src)
        if back is not None:  # else lost: the timeout ends it
            asyncio.get_running_loop().call_later(back, call.succeed, task.result())


@dataclass
class _Call:
    """One call in flight: what its caller awaits, and the handler's task once it runs."""

    done: asyncio.Future
    dst: int
    task: asyncio.Task | None = None

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def succeed(self, result: Any) -> None:
        if not self.done.done():
            self.done.set_result(result)


async def _run(endpoint: Endpoint, handler: Callable[[], Awaitable[T]]) -> T:
    await endpoint.awake()  # a paused process takes the request once it runs again
    result = await handler()
    await endpoint.awake()  # and answers once it runs again
    return result
