"""TtMsgStream's merge, pure: packs per time tick across channels, never a late message."""

from __future__ import annotations

import random

import pytest

from streamwal.client.msgstream_merge import TickRegression, TtMerger
from streamwal.client.msgstream_types import MsgPosition, TsMsg


def msg(name: str, tick: int = 0) -> TsMsg:
    return TsMsg(payload=name.encode(), timestamp=tick)


def payloads(pack) -> list[bytes]:
    return [m.payload for m in pack.msgs]


def test_a_pack_waits_for_every_channel_and_holds_what_is_at_or_below_its_end() -> None:
    m = TtMerger(["a", "b"], group="sub")
    m.push("a", 0, 10, msg("a10"))
    m.push("a", 1, 30, msg("a30"))
    assert m.pop() is None  # b has said nothing: anything of b could still be <= 30
    m.push("b", 0, 20, msg("b20"))
    pack = m.pop()
    assert (pack.begin_ts, pack.end_ts) == (0, 20)
    assert payloads(pack) == [b"a10", b"b20"]
    assert pack.end_positions == [
        MsgPosition.at("a", 0, 20, "sub"),
        MsgPosition.at("b", 0, 20, "sub"),
    ]
    assert m.pop() is None
    m.push("b", 1, 40, None)  # an idle TimeTick: moves time, is not delivered
    pack = m.pop()
    assert (pack.begin_ts, pack.end_ts) == (20, 30) and payloads(pack) == [b"a30"]
    assert pack.start_positions[0].timestamp == 20
    # b stood still up to 30: its position keeps its offset, with the new time.
    assert pack.end_positions == [
        MsgPosition.at("a", 1, 30, "sub"),
        MsgPosition.at("b", 0, 30, "sub"),
    ]


def test_redeliveries_are_dropped_and_tick_regressions_refused() -> None:
    m = TtMerger(["a"])
    m.push("a", 5, 100, msg("x"))
    m.push("a", 5, 100, msg("x"))  # the consumer resumed at 5 again
    assert payloads(m.pop()) == [b"x"]
    with pytest.raises(TickRegression):
        m.push("a", 6, 100, msg("late"))
    with pytest.raises(TickRegression):
        m.push("a", 7, 50, msg("later"))


def test_seek_positions_start_the_merge_after_them() -> None:
    start = [MsgPosition.at("a", 3, 50), MsgPosition.at("b", 9, 60)]
    m = TtMerger(["a", "b"], start=start)
    assert m.last_end == 50
    m.push("a", 3, 40, msg("old"))  # at or before the position: already delivered
    with pytest.raises(TickRegression):
        m.push("b", 10, 55, msg("b55"))  # b's next message must be above its position
    m.push("a", 4, 70, msg("a70"))
    m.push("b", 10, 65, msg("b65"))
    pack = m.pop()
    assert (pack.begin_ts, pack.end_ts) == (50, 65) and payloads(pack) == [b"b65"]


def test_random_interleavings_give_ordered_complete_packs_and_no_late_message() -> None:
    rng = random.Random(7)
    channels = ["a", "b", "c"]
    # Each channel: strictly growing ticks, some messages, some idle TimeTicks.
    logs = {}
    for c in channels:
        tick, entries = 0, []
        for offset in range(200):
            tick += rng.randint(1, 5)
            item = msg(f"{c}{offset}", tick) if rng.random() < 0.7 else None
            entries.append((offset, tick, item))
        logs[c] = entries
    m = TtMerger(channels)
    cursors = dict.fromkeys(channels, 0)
    packs = []
    while any(cursors[c] < len(logs[c]) for c in channels):
        c = rng.choice([c for c in channels if cursors[c] < len(logs[c])])
        offset, tick, item = logs[c][cursors[c]]
        cursors[c] += 1
        m.push(c, offset, tick, item)
        if rng.random() < 0.3 and cursors[c] > 1:  # a redelivery after a reconnect
            m.push(c, *logs[c][cursors[c] - 2])
        while (pack := m.pop()) is not None:
            packs.append(pack)
    delivered_end = 0
    seen = []
    for pack in packs:
        assert pack.begin_ts == delivered_end < pack.end_ts
        ticks = [t.timestamp for t in pack.msgs]
        assert all(delivered_end < t <= pack.end_ts for t in ticks)
        assert ticks == sorted(ticks)
        delivered_end = pack.end_ts
        seen += [t.payload for t in pack.msgs]
    # Complete: every message at or below the last end, exactly once.
    expected = [
        item.payload for c in channels for _, tick, item in logs[c]
        if item is not None and tick <= delivered_end
    ]  # fmt: skip
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
