"""The tail cache reads across consecutive records only: a record cached out of turn
(a follower's write whose caching was skipped) never lets a read step over a hole."""

from streamwal.node import records
from streamwal.node.channel import _TailCache


def _rec(count: int) -> bytes:
    return records.encode(1, 1, count, b"")


def test_a_read_returns_consecutive_records_from_the_one_holding_the_offset() -> None:
    cache = _TailCache()
    for base in (0, 50, 100):
        cache.append(base, base + 50, _rec(50))
    got = cache.read_from(60, 10, 1 << 20)
    assert got is not None and [b for b, _ in got] == [50, 100]


def test_a_record_after_a_hole_starts_the_cache_anew() -> None:
    """The bug the merged core showed: 551 cached, 601 not, 651 cached; a read from 601
    returned 551 then 651, skipping 601..650 (a replica looked different, a reader lost
    records). Now the cache holds 651 alone and a read from 601 goes to the store."""
    cache = _TailCache()
    cache.append(551, 601, _rec(50))
    cache.append(651, 701, _rec(50))  # 601..650 never cached
    assert cache.read_from(601, 10, 1 << 20) is None  # not cached: read the store
    got = cache.read_from(651, 10, 1 << 20)
    assert got is not None and [b for b, _ in got] == [651]


def test_a_cut_then_the_next_record_keeps_the_cache() -> None:
    cache = _TailCache()
    for base in (0, 10, 20):
        cache.append(base, base + 10, _rec(10))
    cache.drop_after(10)  # the log was cut at 10
    cache.append(10, 15, _rec(5))
    got = cache.read_from(0, 10, 1 << 20)
    assert got is not None and [b for b, _ in got] == [0, 10]
