"""The WAL accessor's Scanner: a background read of one vchannel into a handler.

It reads through a `RoutedConsumer`, which follows the pchannel from owner to owner and
reopens just after the last offset it returned; the scanner asks for the next batch only
after the handler took every message of the current one, so "returned" is "delivered" and
a failover neither skips nor repeats a message.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress

from streamwal.client.node_client import ConsumedMessage
from streamwal.client.routing import RoutedConsumer

log = logging.getLogger("streamwal.client.scanner")

Handler = Callable[[ConsumedMessage], Awaitable[None] | None]


class Scanner:
    """Runs until closed, or until the handler or the read fails (`error()`)."""

    def __init__(
        self,
        open_consumer: Callable[[], Awaitable[RoutedConsumer]],
        handler: Handler,
        observe: Callable[[ConsumedMessage], None] = lambda _: None,
    ) -> None:
        self._open = open_consumer
        self._handler = handler
        self._observe = observe
        self._done = asyncio.Event()
        self._error: BaseException | None = None
        self.consumer: RoutedConsumer | None = None
        self.last_delivered: int | None = None  # offset of the last message handled
        self._task = asyncio.create_task(self._run(), name="scanner")

    async def _run(self) -> None:
        try:
            self.consumer = await self._open()
            while True:
                batch = await self.consumer.next_batch()
                if batch is None:
                    return  # the read reached its end
                for msg in batch:
                    result = self._handler(msg)
                    if inspect.isawaitable(result):
                        await result
                    self.last_delivered = msg.offset
                    self._observe(msg)
        except asyncio.CancelledError:
            pass  # closed
        except Exception as exc:
            log.info("scanner stopped", extra={"error": repr(exc)})
            self._error = exc
        finally:
            if self.consumer is not None:
                with suppress(Exception):
                    await self.consumer.close()
            self._done.set()

    def done(self) -> asyncio.Event:
        """Set once the scanner finished or was closed (the seed's Done channel)."""
        return self._done

    def error(self) -> BaseException | None:
        """Why the scanner stopped; None while it runs or after a clean close."""
        return self._error

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        self._task.add_done_callback(lambda _: callback())

    async def close(self) -> None:
        """Stop reading and release the consumer; returns once it stopped."""
        self._task.cancel()
        with suppress(asyncio.CancelledError):
            await self._task
