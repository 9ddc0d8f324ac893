"""When a producer's stream counts as dead: pure, fed with the time and what was heard.

A stream lives while its node answers. A paused (SIGSTOPped) or cut-off node neither
answers nor closes the connection, so without a bound a producer would wait for it for
good; TCP keepalive does not help, since the kernel of a paused process still answers it.
Two bounds, after Kafka's `request.timeout.ms` and gRPC's keepalive:

- busy (requests on the wire): the oldest must be answered within `request_timeout`;
- quiet (nothing on the wire): after `keepalive_interval` without hearing anything from
  the node, the producer pings it (ProduceRequest.ping, answered at once by the node's
  event loop); if nothing at all arrives within `keepalive_timeout` of the ping, the
  stream is dead. A node too old to answer pings is only bounded while busy.

The loop checks every `tick` seconds (a quarter of the smallest bound), so a bound is
noticed at most one tick late; anything received counts as heard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PING: Literal["ping"] = "ping"


@dataclass(frozen=True, slots=True)
class Bounds:
    """A producer's liveness bounds, in seconds (see the module docstring)."""

    request_timeout: float = 10.0
    keepalive_interval: float = 5.0
    keepalive_timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("request_timeout", "keepalive_interval", "keepalive_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")

    @property
    def tick(self) -> float:
        """How often the loop checks."""
        return min(self.request_timeout, self.keepalive_interval, self.keepalive_timeout) / 4


@dataclass(frozen=True, slots=True)
class Dead:
    """The stream is dead: no answer within a bound (`reason` says which)."""

    reason: str


class Liveness:
    """The liveness state of one stream: when the node was last heard, and the ping out."""

    def __init__(self, bounds: Bounds, now: float, can_ping: bool) -> None:
        self.bounds = bounds
        self.can_ping = can_ping
        self.last_heard = now
        self.ping_sent: float | None = None

    def heard(self, now: float) -> None:
        """Something arrived from the node (an answer, a pong, anything)."""
        self.last_heard = now

    def check(self, now: float, oldest_sent: float | None) -> Literal["ping"] | Dead | None:
        """What to do now: PING the node, give the stream up (Dead), or nothing (None).

        `oldest_sent`: when the oldest unanswered request left (None: nothing on the wire).
        """
        b = self.bounds
        if oldest_sent is not None:
            self.ping_sent = None  # the requests are the probe now
            waited = now - oldest_sent
            if waited > b.request_timeout:
                return Dead(
                    f"no answer to a request for {waited:.1f}s "
                    f"(request_timeout {b.request_timeout:g}s)"
                )
            return None
        if not self.can_ping:
            return None
        if self.ping_sent is not None:
            if self.last_heard >= self.ping_sent:
                self.ping_sent = None  # answered (or anything else arrived since)
            elif now - self.ping_sent > b.keepalive_timeout:
                return Dead(
                    f"no answer to a keepalive ping for {now - self.ping_sent:.1f}s "
                    f"(keepalive_timeout {b.keepalive_timeout:g}s)"
                )
            else:
                return None
        if now - self.last_heard >= b.keepalive_interval:
            self.ping_sent = now
            return PING
        return None
