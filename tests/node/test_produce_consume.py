"""Produce and consume against a real node under every DeliverPolicy and DeliverFilter.

Two pchannels hold the same sequence of messages, one written by streamwal's batching
producer and one by a seed-style producer (one ProduceMessageRequest per message); each
case is read by streamwal's batched consumer and by a seed-style consumer (one
ConsumeMessageReponse per message). Every pchannel ends with an END marker per vchannel, so
a reader knows it has seen everything a case delivers and can assert nothing extra came.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverFilter, DeliverPolicy
from streamwal.ids import decode_offset
from streamwal.testing.local_node import LocalNode
from tests.node.helpers import RawConsumer, RawProducer, is_tick, read_data

V0, V1 = "_v0", "_v1"  # vchannel suffixes: "<pchannel>_v0"


@dataclass(frozen=True)
class Sent:
    offset: int
    tick: int
    vchannel: str
    payload: bytes


PLAN: list[tuple[str, list[bytes]]] = [
    ("batch", [f"a{i}".encode() for i in range(10)]),  # 10 on v0, one atomic batch
    ("batch", [f"b{i}".encode() for i in range(10)]),  # 10 on v1
    *[("single", [f"c{i}".encode()]) for i in range(6)],  # alternating v0 / v1
]


def _vchannel(pch: str, step: int, payload: bytes) -> str:
    if step == 0:
        return pch + V0
    if step == 1:
        return pch + V1
    return pch + (V0 if int(payload[1:]) % 2 == 0 else V1)


async def _write_batched(address: str, pch: str) -> list[Sent]:
    sent: list[Sent] = []
    async with NodeClient(address) as c:
        await c.assign(pch, 1)
        producer = await c.producer(pch, 1)
        for step, (_, payloads) in enumerate(PLAN):
            vc = _vchannel(pch, step, payloads[0])
            results = await producer.send_many(payloads, vchannel=vc)
            sent += [
                Sent(r.offset, r.time_tick, vc, p) for r, p in zip(results, payloads, strict=True)
            ]
        for marker, vc in ((b"END0", pch + V0), (b"END1", pch + V1)):
            await producer.send(marker, vchannel=vc)
        await producer.close()
    return sent


async def _write_seed_style(address: str, pch: str) -> list[Sent]:
    sent: list[Sent] = []
    async with NodeClient(address) as c:
        await c.assign(pch, 1)
    producer = RawProducer(address, pch, 1)
    await producer.open()
    for step, (_, payloads) in enumerate(PLAN):
        vc = _vchannel(pch, step, payloads[0])
        for p in payloads:
            resp = await producer.send(p, {"_vc": vc})
            sent.append(Sent(decode_offset(resp.result.id.id), resp.result.time_tick, vc, p))
    for marker, vc in ((b"END0", pch + V0), (b"END1", pch + V1)):
        await producer.send_ok(marker, {"_vc": vc})
    await producer.close()
    return sent


@pytest.fixture(scope="module")
def dataset(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalNode, dict[str, list[Sent]]]]:
    node = LocalNode(tmp_path_factory.mktemp("pc") / "n1").start(timeout=60)
    try:

        async def write_both() -> dict[str, list[Sent]]:
            return {
                "batched": await _write_batched(node.address, "bat"),
                "seed": await _write_seed_style(node.address, "sd"),
            }

        data = asyncio.run(write_both())
        yield node, data
    finally:
        node.kill()


def test_acknowledged_offsets_and_ticks_are_dense_and_growing(dataset) -> None:
    _, data = dataset
    for path, sent in data.items():
        offsets = [s.offset for s in sent]
        ticks = [s.tick for s in sent]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)
        if path == "seed":
            continue
        # Inside a batch offsets and ticks are consecutive (the batch is one record).
        assert offsets[:10] == list(range(offsets[0], offsets[0] + 10))
        assert ticks[:10] == list(range(ticks[0], ticks[0] + 10))


def _msg_view(offset: int, payload: bytes, props: dict[str, str]) -> tuple:
    return (offset, payload, props.get("_vc"), int(props["_tt"]), props["_wt"])


async def _read_case(
    consumer_path: str, address: str, pch: str, policy, filters
) -> tuple[list[tuple], bytes]:
    """Data messages before the first END marker, and that marker."""
    out: list[tuple] = []
    deadline = time.monotonic() + 20
    if consumer_path == "batched":
        async with NodeClient(address) as c:
            consumer = await c.consumer(pch, 1, policy, filters, time_ticks=True)
            async for m in consumer:
                assert time.monotonic() < deadline, "no END marker within 20 s"
                if is_tick(m):
                    assert "_vc" not in m.properties
                    continue
                if m.payload.startswith(b"END"):
                    await consumer.close()
                    return out, m.payload
                out.append(_msg_view(m.offset, m.payload, m.properties))
        raise AssertionError("consumer ended before the END marker")
    consumer = RawConsumer(address, pch, 1, policy, filters)
    await consumer.open()
    while True:
        m = await consumer.next(max(0.1, deadline - time.monotonic()))
        if m.is_tick:
            continue
        if m.payload.startswith(b"END"):
            await consumer.close()
            return out, m.payload
        out.append(_msg_view(m.offset, m.payload, m.properties))


def _expect(sent: list[Sent], keep) -> list[tuple]:
    return [
        (s.offset, s.payload, s.vchannel, s.tick, "1") for i, s in enumerate(sent) if keep(i, s)
    ]


# (case id, policy(sent), filters(sent, pch), keep(i, s), END marker seen first)
CASES = [
    ("all", lambda d: DeliverPolicy.all(), lambda d, p: [], lambda i, s: True, b"END0"),
    # No policy: NodeClient sends `all`; the seed-style consumer leaves the field unset.
    ("unset", lambda d: None, lambda d, p: [], lambda i, s: True, b"END0"),
    (
        "from-mid-batch",
        lambda d: DeliverPolicy.start_from(d[3].offset),
        lambda d, p: [],
        lambda i, s: i >= 3,
        b"END0",
    ),
    (
        "from-batch-start",
        lambda d: DeliverPolicy.start_from(d[10].offset),
        lambda d, p: [],
        lambda i, s: i >= 10,
        b"END0",
    ),
    (
        "after-mid-batch",
        lambda d: DeliverPolicy.start_after(d[7].offset),
        lambda d, p: [],
        lambda i, s: i >= 8,
        b"END0",
    ),
    (
        "after-batch-end",
        lambda d: DeliverPolicy.start_after(d[9].offset),
        lambda d, p: [],
        lambda i, s: i >= 10,
        b"END0",
    ),
    (
        "after-single",
        lambda d: DeliverPolicy.start_after(d[22].offset),
        lambda d, p: [],
        lambda i, s: i >= 23,
        b"END0",
    ),
    (
        "tick-gt",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.time_tick_gt(d[12].tick)],
        lambda i, s: i >= 13,
        b"END0",
    ),
    (
        "tick-gte",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.time_tick_gte(d[12].tick)],
        lambda i, s: i >= 12,
        b"END0",
    ),
    (
        "tick-gt-mid-batch",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.time_tick_gt(d[4].tick)],
        lambda i, s: i >= 5,
        b"END0",
    ),
    (
        "tick-gte-single",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.time_tick_gte(d[21].tick)],
        lambda i, s: i >= 21,
        b"END0",
    ),
    (
        "vchannel-v1",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.vchannel(p + V1)],
        lambda i, s: s.vchannel.endswith(V1),
        b"END1",
    ),
    (
        "vchannel-v0",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.vchannel(p + V0)],
        lambda i, s: s.vchannel.endswith(V0),
        b"END0",
    ),
    (
        "vchannel-and-tick",
        lambda d: DeliverPolicy.all(),
        lambda d, p: [DeliverFilter.vchannel(p + V0), DeliverFilter.time_tick_gte(d[5].tick)],
        lambda i, s: i >= 5 and s.vchannel.endswith(V0),
        b"END0",
    ),
    (
        "from-and-vchannel",
        lambda d: DeliverPolicy.start_from(d[15].offset),
        lambda d, p: [DeliverFilter.vchannel(p + V1)],
        lambda i, s: i >= 15 and s.vchannel.endswith(V1),
        b"END1",
    ),
    (
        "after-and-tick-gt",
        lambda d: DeliverPolicy.start_after(d[2].offset),
        lambda d, p: [DeliverFilter.time_tick_gt(d[11].tick)],
        lambda i, s: i >= 12,
        b"END0",
    ),
    (
        "tick-filter-wins-over-position",
        lambda d: DeliverPolicy.start_from(d[20].offset),
        lambda d, p: [DeliverFilter.time_tick_gte(d[1].tick)],
        lambda i, s: i >= 20,
        b"END0",
    ),
]


@pytest.mark.parametrize("consumer_path", ["batched", "seed"])
@pytest.mark.parametrize("producer_path", ["batched", "seed"])
@pytest.mark.parametrize(
    ("case", "policy", "filters", "keep", "end"), CASES, ids=[c[0] for c in CASES]
)
async def test_policy_and_filter(
    dataset, producer_path, consumer_path, case, policy, filters, keep, end
) -> None:
    node, data = dataset
    pch = "bat" if producer_path == "batched" else "sd"
    sent = data[producer_path]
    got, marker = await _read_case(
        consumer_path, node.address, pch, policy(sent), filters(sent, pch)
    )
    assert got == _expect(sent, keep)
    assert marker == end


@pytest.mark.parametrize("consumer_path", ["batched", "seed"])
async def test_latest_starts_at_the_last_message_then_tails(
    start_node, pchannel, consumer_path
) -> None:
    node = start_node("n1", "--time-tick-interval", "60s")  # no ticks: the log end is ours
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        await producer.send_many([b"old0", b"old1", b"old2"])
        last = await producer.send(b"last")
        if consumer_path == "batched":
            consumer = await c.consumer(pchannel, 1, DeliverPolicy.latest())
            assert consumer.next_offset == last.offset + 1
            first = (await read_data(consumer, 1))[0]
            assert (first.offset, first.payload) == (last.offset, b"last")
            new = await producer.send(b"new")
            nxt = (await read_data(consumer, 1, timeout=5))[0]
            assert (nxt.offset, nxt.payload) == (new.offset, b"new")
            await consumer.close()
        else:
            consumer = RawConsumer(node.address, pchannel, 1, DeliverPolicy.latest())
            created = await consumer.open()
            assert created.next_offset == last.offset + 1
            first = (await consumer.data(1))[0]
            assert (first.offset, first.payload) == (last.offset, b"last")
            new = await producer.send(b"new")
            nxt = (await consumer.data(1, timeout=5))[0]
            assert (nxt.offset, nxt.payload) == (new.offset, b"new")
            await consumer.close()
        await producer.close()


async def test_latest_on_an_empty_pchannel_waits_for_the_first_message(
    start_node, pchannel
) -> None:
    node = start_node("n1", "--time-tick-interval", "60s")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.latest())
        assert (consumer.first_offset, consumer.next_offset) == (0, 0)
        producer = await c.producer(pchannel, 1)
        r = await producer.send(b"first")
        got = await read_data(consumer, 1, timeout=5)
        assert (got[0].offset, got[0].payload) == (r.offset, b"first") == (0, b"first")
        await consumer.close()
        await producer.close()


@pytest.mark.parametrize("consumer_path", ["batched", "seed"])
async def test_caught_up_consumer_gets_new_messages_promptly(
    client, pchannel, node, consumer_path
) -> None:
    """Catch up from disk, then tail: each new message arrives well within a second."""
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    history = await producer.send_many([b"h%d" % i for i in range(500)])
    if consumer_path == "batched":
        consumer = await client.consumer(pchannel, 1, DeliverPolicy.all())
        got = await read_data(consumer, 500)
        next_data = lambda: read_data(consumer, 1, timeout=5)  # noqa: E731
    else:
        consumer = RawConsumer(node.address, pchannel, 1, DeliverPolicy.all())
        await consumer.open()
        got = await consumer.data(500)
        next_data = lambda: consumer.data(1, timeout=5)  # noqa: E731
    assert [m.offset for m in got] == [r.offset for r in history]
    delays = []
    for i in range(8):
        await asyncio.sleep(0.05 * (i % 3))  # sometimes while a time tick is pending
        sent_at = time.monotonic()
        reader = asyncio.ensure_future(next_data())
        r = await producer.send(b"live%d" % i)
        m = (await reader)[0]
        delays.append(time.monotonic() - sent_at)
        assert (m.offset, m.payload) == (r.offset, b"live%d" % i)
    await consumer.close()
    await producer.close()
    # Polling once a second (the node's fallback wake-up) would put the median near 0.5 s.
    assert statistics.median(delays) < 0.25, delays
    assert max(delays) < 1.0, delays


async def test_stalled_consumers_do_not_slow_producers(client, node, pchannel) -> None:
    """Consumers that stop reading hold back only themselves; they catch up afterwards."""
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    payload = b"s" * 8192
    per_round, rounds = 200, 12  # ~20 MB per phase: far beyond the HTTP/2 windows

    async def phase(tag: int) -> float:
        started = time.monotonic()
        for r in range(rounds):
            await asyncio.wait_for(
                producer.send_many([payload + b"%d.%d" % (tag, r)] * per_round), timeout=20
            )
        return time.monotonic() - started

    baseline = await phase(0)
    stalled = await client.consumer(pchannel, 1, DeliverPolicy.all())
    stalled_seed = RawConsumer(node.address, pchannel, 1, DeliverPolicy.all())
    await stalled_seed.open()
    first = await read_data(stalled, 1)  # it is live, then stops reading
    assert first[0].offset <= 1  # an idle TimeTick may come first
    with_stall = await phase(1)
    # The stall must not cost producers more than noise on a shared 2-core machine.
    print(f"produce phase: {baseline:.2f} s alone, {with_stall:.2f} s with two stalled consumers")
    assert with_stall < max(3 * baseline, baseline + 3.0), (baseline, with_stall)
    status = await client.collect_status()
    (st,) = [s for s in status.channels if s.pchannel.name == pchannel]
    assert st.consumers == 2
    total = 2 * rounds * per_round
    # Both stalled consumers still get everything, in order.
    rest = await read_data(stalled, total - 1, timeout=60)
    assert [m.offset for m in first + rest] == sorted(m.offset for m in first + rest)
    assert len({m.offset for m in first + rest}) == total
    assert rest[-1].payload.endswith(b"1.%d" % (rounds - 1))
    seed_msgs = await stalled_seed.data(total, timeout=60)
    assert seed_msgs[-1].offset == rest[-1].offset
    await stalled.close()
    await stalled_seed.close()
    await producer.close()


def test_dataset_node_log_is_clean(dataset) -> None:
    node, _ = dataset
    log = Path(node.log_path).read_text()
    assert "Traceback" not in log, log[-3000:]


async def test_half_closed_consumer_keeps_tailing(client, node, pchannel) -> None:
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    await producer.send(b"before")
    consumer = RawConsumer(node.address, pchannel, 1, DeliverPolicy.all())
    await consumer.open()
    await consumer.call.done_writing()
    assert (await consumer.data(1))[0].payload == b"before"
    await producer.send(b"after")
    assert (await consumer.data(1, timeout=5))[0].payload == b"after"
    await producer.close()
