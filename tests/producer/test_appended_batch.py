"""`send_many`'s result: a batch's landing places, made as they are read, behaving as the
list of `Appended` it replaced (callers index, slice, iterate and compare it)."""

from __future__ import annotations

import pytest

from streamwal.client.producer import Appended, AppendedBatch


def test_an_appended_batch_reads_as_the_list_it_stands_for() -> None:
    batch = AppendedBatch(10, 100, 3)
    expected = [Appended(10, 100), Appended(11, 101), Appended(12, 102)]
    assert list(batch) == expected and batch == expected and expected == batch
    assert len(batch) == 3 and batch[0] == expected[0] and batch[-1] == expected[-1]
    assert batch[1:] == expected[1:] and batch[::-1] == expected[::-1]
    assert Appended(11, 101) in batch and batch.index(Appended(12, 102)) == 2
    assert batch != expected[:2] and batch != [*expected[:2], Appended(12, 999)]
    assert repr(batch) == repr(expected)
    assert batch + AppendedBatch(13, 103, 1) == [*expected, Appended(13, 103)]
    assert [Appended(9, 99)] + batch == [Appended(9, 99), *expected]  # noqa: RUF005
    with pytest.raises(IndexError):
        batch[3]
    with pytest.raises(IndexError):
        batch[-4]
    assert AppendedBatch(0, 0, 0) == [] and not AppendedBatch(5, 5, 0)
    with pytest.raises(TypeError):
        hash(batch)  # as a list's
