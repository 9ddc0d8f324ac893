"""Time-tick merge of several channels into MsgPacks: TtMsgStream's decision logic, no I/O.

Each channel delivers messages in offset order with strictly growing time ticks (a
pchannel's ticks only grow, also across terms; a vchannel is a filtered pchannel). A
channel whose latest tick is T can therefore never deliver anything at or below T again,
so once every channel has passed T, everything up to T is known. A pack is cut at
end_ts = the smallest of the channels' latest ticks and holds every buffered message with
begin_ts < tick <= end_ts (begin_ts = the previous pack's end), ordered by tick; idle
TimeTick messages only move the channels' ticks and are not delivered.

The guarantee the stream relies on: no delivered message has a tick at or below an
already delivered pack's end. A channel that breaks tick order would break it, so such a
message is refused with `TickRegression` instead of being delivered late or dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streamwal.client.msgstream_types import MsgPack, MsgPosition, TsMsg
from streamwal.errors import Inner


class TickRegression(Inner):
    """A channel delivered a tick at or below one it had delivered (or the stream's start)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    tick: int
    offset: int
    msg: TsMsg | None  # None: a TimeTick (moves time, is not delivered)


class TtMerger:
    """Buffers per channel and cuts packs when every channel has passed a tick."""

    def __init__(
        self,
        channels: Sequence[str],
        group: str = "",
        start: Iterable[MsgPosition] = (),
    ) -> None:
        if not channels:
            raise ValueError("a time-tick merge needs at least one channel")
        self.channels = list(channels)
        self.group = group
        self._order = {c: i for i, c in enumerate(self.channels)}
        self._buffers: dict[str, deque[_Entry]] = {c: deque() for c in self.channels}
        self._latest: dict[str, int] = dict.fromkeys(self.channels, 0)
        self._last_offset: dict[str, int] = dict.fromkeys(self.channels, -1)
        self._positions: dict[str, MsgPosition | None] = dict.fromkeys(self.channels, None)
        self.last_end = 0
        starts = list(start)
        for pos in starts:
            if pos.channel_name not in self._order:
                raise ValueError(f"position for {pos.channel_name!r}, not a channel of the merge")
            self._latest[pos.channel_name] = pos.timestamp
            self._last_offset[pos.channel_name] = pos.offset
            self._positions[pos.channel_name] = pos
        if starts:
            # Every channel resumes after its position, whose tick is at least the smallest.
            self.last_end = min(p.timestamp for p in starts)
        for c in self.channels:
            self._latest[c] = max(self._latest[c], self.last_end)

    def push(self, channel: str, offset: int, tick: int, msg: TsMsg | None) -> None:
        """Take one delivered message (`msg=None` for a TimeTick)."""
        if offset <= self._last_offset[channel]:
            return  # a redelivery (the consumer resumed at or before it): already taken
        if tick <= self._latest[channel]:
            raise TickRegression(
                f"channel {channel!r}: message at offset {offset} has tick {tick}, "
                f"not above the channel's {self._latest[channel]}"
            )
        self._last_offset[channel] = offset
        self._latest[channel] = tick
        self._buffers[channel].append(_Entry(tick, offset, msg))

    @property
    def safe_tick(self) -> int:
        """Every channel has passed this tick."""
        return min(self._latest.values())

    def pop(self) -> MsgPack | None:
        """The next pack, or None until every channel has passed the last pack's end."""
        end = self.safe_tick
        if end <= self.last_end:
            return None
        start_positions = [p for p in self._positions.values() if p is not None]
        taken: list[tuple[int, int, int, TsMsg]] = []
        for channel, buffer in self._buffers.items():
            last: _Entry | None = None
            while buffer and buffer[0].tick <= end:
                last = buffer.popleft()
                if last.msg is not None:
                    taken.append((last.tick, self._order[channel], last.offset, last.msg))
            if last is not None:
                self._positions[channel] = MsgPosition.at(channel, last.offset, end, self.group)
            elif self._positions[channel] is not None:
                prev = self._positions[channel]
                self._positions[channel] = MsgPosition(
                    channel, prev.msg_id, self.group, end
                )  # nothing new up to `end`: the channel stands where it stood
        taken.sort(key=lambda t: t[:3])
        pack = MsgPack(
            begin_ts=self.last_end,
            end_ts=end,
            msgs=[t[3] for t in taken],
            start_positions=start_positions,
            end_positions=[p for p in self._positions.values() if p is not None],
        )
        self.last_end = end
        return pack
