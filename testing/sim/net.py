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
        Unavailable when the call cannot complete within `timeout`."""
        self.calls += 1
        try:
            return await asyncio.wait_for(self._call(src, dst, handler), timeout)
        except TimeoutError:
            raise Unavailable(f"{what} {src}->{dst}: no answer within {timeout:.3f}s") from None

    async def _call(self, src: int, dst: int, handler: Callable[[], Awaitable[Any]]) -> Any:
        there = self._leg(src, dst)
        if there is None:
            await asyncio.Event().wait()  # lost: the caller's timeout ends it
        await asyncio.sleep(there or 0.0)
        endpoint = self.endpoints.get(dst)
        if endpoint is None or not endpoint.up:
            raise Unavailable(f"connection refused by {dst}")
        await endpoint.awake()
        task = endpoint.spawn(_run(endpoint, handler))
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise Unavailable(f"{dst} went down during the call") from None
            raise
        back = self._leg(dst, src)
        if back is None:
            await asyncio.Event().wait()
        await asyncio.sleep(back or 0.0)
        return result


async def _run(endpoint: Endpoint, handler: Callable[[], Awaitable[T]]) -> T:
    result = await handler()
    await endpoint.awake()  # a paused process answers once it runs again
    return result
