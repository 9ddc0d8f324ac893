"""How long an API request must wait to keep the operator under its rate (QPS and burst).

client-go's controllers carry the same two settings: a failover of N PChannels costs the
API server about 2 N status patches, N Events and the lists that follow, and the
operator must not turn one node loss into a burst the server's priority and fairness
answers with 429s for everybody. Pure: the caller passes the time and sleeps the answer.

Reservations are handed out in call order and may run the bucket below zero, so waiters
are served first come, first served and none is starved (golang.org/x/time/rate's
`Reserve`). A 429's Retry-After pauses the whole bucket: the server spoke for all calls.
"""

from __future__ import annotations

# The operator's defaults (`--kube-api-qps`, `--kube-api-burst`): a failover of 1,000
# PChannels (about 3,000 requests) in ~15 s; a local API server answers far more.
DEFAULT_QPS, DEFAULT_BURST = 200.0, 400


class Throttled(Exception):
    """The wait for a request slot would exceed the caller's bound: too many queued."""


class TokenBucket:
    """`rate` requests a second on average, up to `burst` at once after a quiet spell."""

    def __init__(self, rate: float, burst: int, max_wait: float) -> None:
        if rate <= 0 or burst < 1 or max_wait <= 0:
            raise ValueError(
                f"rate > 0, burst >= 1, max_wait > 0 (got {rate}, {burst}, {max_wait})"
            )
        self.rate = rate
        self.burst = burst
        self.max_wait = max_wait
        self.tokens = float(burst)
        self.at: float | None = None  # when `tokens` was last brought up to date
        self.paused_until = 0.0

    def _refill(self, now: float) -> None:
        if self.at is not None and now > self.at:
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now if self.at is None else max(self.at, now)

    def reserve(self, now: float) -> float:
        """Take a slot: the seconds to wait before the request goes out (0: at once).

        Raises Throttled, taking nothing, when the wait would exceed `max_wait`."""
        self._refill(now)
        after = self.tokens - 1
        wait = max(0.0 if after >= 0 else -after / self.rate, self.paused_until - now)
        if wait > self.max_wait:
            raise Throttled(
                f"{-after:.0f} API requests queued ahead at {self.rate:g}/s (burst "
                f"{self.burst}): a slot is {wait:.1f}s away, over the {self.max_wait:g}s bound"
            )
        self.tokens = after
        return wait

    def take_now(self, now: float) -> bool:
        """Take a slot only if one is free at once (requests that may be dropped, such as
        Events, never delay or queue ahead of the ones that may not)."""
        self._refill(now)
        if self.tokens < 1 or self.paused_until > now:
            return False
        self.tokens -= 1
        return True

    def pause(self, now: float, seconds: float) -> None:
        """The server asked for `seconds` of quiet (429 Retry-After): no slot before then."""
        self.paused_until = max(self.paused_until, now + max(0.0, seconds))
