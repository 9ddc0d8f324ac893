"""What a consumer hands out: one delivered message, and one frame's worth of them.

A frame carries its messages as one serialized MessageBatch plus the numbers to place
them: a first offset (the rest follow densely) or an explicit offset per message, and
the ticks as one run per stored record or one per message. Making a ConsumedMessage for
each message costs about 0.9 µs of Python, more than the rest of a catch-up's
per-message work on this machine. A ConsumedBatch therefore makes them only when it is
iterated or indexed, and gives whole columns (`payloads`, `offsets`, `time_ticks`)
without them: a reader that wants the bytes (a bulk copy, an Arrow batch) skips that
cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from streamwal.errors import InvalidArgument
from streamwal.ids import decode_offset
from streamwal.message import PROP_TERM, PROP_TIME_TICK, PROP_TYPE, PROP_VCHANNEL, msg_type_of
from streamwal.proto import streaming_pb2 as pb


class ConsumedMessage:
    """A delivered message; properties include the node-set `_tt` and `_wt`."""

    __slots__ = ("_msg", "offset", "term", "time_tick")

    def __init__(self, offset: int, term: int, time_tick: int, msg: pb.Message) -> None:
        self.offset = offset
        self.term = term
        self.time_tick = time_tick
        self._msg = msg

    @property
    def payload(self) -> bytes:
        return self._msg.payload

    @property
    def properties(self) -> dict[str, str]:
        props = dict(self._msg.properties)
        props[PROP_TIME_TICK] = str(self.time_tick)
        props[PROP_TERM] = str(self.term)
        return props

    @property
    def msg_type(self) -> int:
        """The MsgType code; InvalidArgument for a `_t` that is none (stored before the
        node checked it at the edge): a clear error where readers used to crash."""
        try:
            return msg_type_of(self._msg.properties.get(PROP_TYPE))
        except ValueError as exc:
            raise InvalidArgument(f"message at offset {self.offset}: {exc}") from None

    @property
    def vchannel(self) -> str | None:
        return self._msg.properties.get(PROP_VCHANNEL)

    def __repr__(self) -> str:
        return (
            f"ConsumedMessage(offset={self.offset}, term={self.term}, tick={self.time_tick}, "
            f"type={self.msg_type}, vchannel={self.vchannel!r}, {len(self.payload)} bytes)"
        )


class ConsumedBatch(Sequence[ConsumedMessage]):
    """One ConsumeBatchResponse's messages, in offset order; a read-only sequence.

    Slicing gives a list. The ConsumedMessage objects are made once, on first use.

    The frame's MessageBatch is parsed here, when the frame arrives, not on first use:
    a reader loop (`batch = await consumer.next_batch()`) still holds the previous frame
    then, so glibc's heap reuses the previous frame's memory for this one. Parsed after
    the previous frame was freed, every frame grew the heap and gave it back to the
    system (brk, then a page fault on each new page), which cost more CPU per message
    than the parse (docs/benchmarks.md, "CPU per message").
    """

    __slots__ = ("_frame", "_items", "_messages", "term")

    def __init__(self, frame: pb.ConsumeBatchResponse) -> None:
        self._frame = frame
        self._messages: Sequence[pb.Message] = pb.MessageBatch.FromString(frame.messages).messages
        self._items: list[ConsumedMessage] | None = None
        self.term = frame.term

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> ConsumedMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ConsumedMessage]: ...
    def __getitem__(self, index):
        return self.messages()[index]

    def __iter__(self) -> Iterator[ConsumedMessage]:
        return iter(self.messages())

    def __repr__(self) -> str:
        if not self._messages:
            return "ConsumedBatch([])"
        offsets = self.offsets
        return f"ConsumedBatch({len(self)} messages, offsets {offsets[0]}..{offsets[-1]})"

    @property
    def raw_messages(self) -> Sequence[pb.Message]:
        """The frame's protobuf Messages as parsed (no node-set `_tt`/`_wt` in their
        properties): for readers that build their own columns."""
        return self._messages

    @property
    def frame(self) -> pb.ConsumeBatchResponse:
        """The frame as received: for readers that build the offset and tick columns
        from its numbers (the Spark source)."""
        return self._frame

    @property
    def serialized_messages(self) -> bytes:
        """The frame's messages as the node sent them, one serialized MessageBatch: for
        readers that decode whole columns at once (the Spark source)."""
        return self._frame.messages

    @property
    def payloads(self) -> list[bytes]:
        return [m.payload for m in self._messages]

    @property
    def offsets(self) -> list[int]:
        b = self._frame
        if b.offsets:
            return list(b.offsets)
        first = decode_offset(b.first_id.id)
        return list(range(first, first + len(self._messages)))

    @property
    def time_ticks(self) -> list[int]:
        b = self._frame
        if b.offsets:
            return list(b.time_ticks)
        if not b.tick_run_counts:
            return list(range(b.first_time_tick, b.first_time_tick + len(self._messages)))
        out: list[int] = []
        for n, tick in zip(b.tick_run_counts, b.tick_run_first_ticks, strict=True):
            out += range(tick, tick + n)
        return out

    def messages(self) -> list[ConsumedMessage]:
        """The messages as a list (made on first use, then kept)."""
        if self._items is None:
            term = self.term
            self._items = [
                ConsumedMessage(o, term, t, m)
                for o, t, m in zip(self.offsets, self.time_ticks, self._messages, strict=True)
            ]
        return self._items
