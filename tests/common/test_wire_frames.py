"""Pure: frames of the produce port cut from a byte stream however it is chunked."""

from __future__ import annotations

import random

import pytest

from streamwal import wire


def _frames(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        wire.frame(wire.PRODUCE_REQUEST, bytes([i % 256]) * rng.choice([0, 1, 4, 700, 70_000]))
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_frames_come_out_whole_and_in_order_from_any_chunking(seed: int) -> None:
    frames = _frames(120, seed)
    data = b"".join(frames)
    rng = random.Random(seed)
    cutter, out, i = wire.FrameCutter(), [], 0
    while i < len(data):
        n = rng.choice([1, 3, 5, 6, 100, 4096, 65536, 300_000])
        cutter.feed(data[i : i + n])
        i += n
        while (got := cutter.next()) is not None:
            out.append(got)
    assert [wire.frame(kind, body) for kind, body in out] == frames
    cutter.check_ended()  # ended between frames: nothing to say


def test_a_big_frame_in_small_chunks_is_joined_once_not_per_chunk() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    data = wire.frame(wire.PRODUCE_REQUEST, body)
    cutter = wire.FrameCutter()
    for i in range(0, len(data), 1000):
        cutter.feed(data[i : i + 1000])
        if i + 1000 < len(data):
            assert cutter.next() is None
    assert cutter.next() == (wire.PRODUCE_REQUEST, body)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"\x00\x00", "inside a frame header (2 bytes)"),
        (wire.frame(wire.PRODUCE_REQUEST, b"abcdef")[:-2], "inside a frame (4 of 6 bytes)"),
    ],
)
def test_a_stream_that_stops_inside_a_frame_is_an_error(data: bytes, text: str) -> None:
    cutter = wire.FrameCutter()
    cutter.feed(data)
    assert cutter.next() is None
    with pytest.raises(wire.FrameError, match=text.replace("(", r"\(").replace(")", r"\)")):
        cutter.check_ended()


@pytest.mark.parametrize(
    ("head", "text"),
    [(b"\x00\x00\x00\x02\x63", "unknown frame kind 99"), (b"\x00\x00\x01\x00\x01", "over the")],
)
def test_a_bad_header_is_refused_before_its_body_arrives(head: bytes, text: str) -> None:
    cutter = wire.FrameCutter(limit=100)
    cutter.feed(head)
    with pytest.raises(wire.FrameError, match=text):
        cutter.next()
