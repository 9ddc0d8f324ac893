"""kill -9 of a node while producers have batches in flight, then restart on the same data.

Each batch's payloads encode (batch id, index), so after the restart the log itself says
which batches landed and whether any landed in part. Acknowledged means durable: every
acknowledged batch is there, whole, once, at the offset that was acknowledged; offsets
are dense; nothing unacknowledged is half-written. Fences and terms survive restarts too.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import pytest

from streamwal.client.node_client import ConsumedMessage, NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.errors import (
    ChannelFenced,
    ChannelNotExist,
    IgnoredOperation,
    StreamingError,
    UnmatchedChannelTerm,
)
from tests.node.helpers import is_tick, read_data, read_through, tagged, untag

PRODUCERS = 4
KILLS = 3


@dataclass
class Ledger:
    """What the producers asked for and what the node acknowledged."""

    sizes: dict[int, int] = field(default_factory=dict)  # batch id -> messages
    acked: dict[int, int] = field(default_factory=dict)  # batch id -> first offset
    order: dict[int, list[int]] = field(default_factory=dict)  # producer -> batch ids sent


async def _pump(
    address: str, pch: str, pid: int, round_: int, ledger: Ledger, stop: asyncio.Event
) -> None:
    rng = random.Random(pid * 100 + round_)
    async with NodeClient(address) as c:
        producer = await c.producer(pch, 1)
        pending: set[asyncio.Task] = set()
        j = 0
        while not stop.is_set() and j < 20_000:
            bid = (pid << 24) | (round_ << 16) | j
            size = rng.choice([1, 2, 7, 31, 64])
            pad = rng.choice([0, 40, 300])
            ledger.sizes[bid] = size
            ledger.order.setdefault(pid, []).append(bid)
            task = asyncio.ensure_future(
                producer.send_many([tagged(bid, i, pad) for i in range(size)])
            )
            task.bid = bid  # type: ignore[attr-defined]
            pending.add(task)
            j += 1
            if len(pending) >= 6:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not _record(done, ledger):
                    break
        if pending:
            done, _ = await asyncio.wait(pending, timeout=20)
            _record(done, ledger)
        await asyncio.wait_for(producer.close(), 10)


def _record(done: set[asyncio.Task], ledger: Ledger) -> bool:
    """Notes acknowledgements; False once the node went away."""
    ok = True
    for task in done:
        exc = task.exception()
        if exc is None:
            ledger.acked[task.bid] = task.result()[0].offset  # type: ignore[attr-defined]
        else:
            assert isinstance(exc, StreamingError), repr(exc)
            ok = False
    return ok


async def _read_log(address: str, pch: str) -> list[ConsumedMessage]:
    async with NodeClient(address) as c:
        await c.wait_ready(30)
        await c.assign(pch, 1)  # a restarted node serves once re-assigned (idempotent)
        consumer = await c.consumer(pch, 1, DeliverPolicy.all(), time_ticks=True)
        end = consumer.next_offset
        msgs = await read_through(consumer, end - 1, timeout=60) if end else []
        await consumer.close()
    return msgs


def _check_log(msgs: list[ConsumedMessage], ledger: Ledger, dense: bool = True) -> dict[int, int]:
    """Asserts every durability promise over the whole log; returns batch id -> offset.

    Offsets are dense, except that after an unclean stop under async durability the log
    skips the offsets a power loss might have taken (never handing them out again)."""
    offsets = [m.offset for m in msgs]
    if dense:
        assert offsets == list(range(len(msgs))), "offsets are not dense from 0"
    else:
        assert all(a < b for a, b in itertools.pairwise(offsets)), "offsets went back"
    ticks = [m.time_tick for m in msgs]
    assert all(a < b for a, b in itertools.pairwise(ticks)), "ticks went back"
    stored: dict[int, int] = {}
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if is_tick(m):
            i += 1
            continue
        bid, index = untag(m.payload)
        assert index == 0, f"batch {bid:#x} starts at index {index} (offset {m.offset})"
        assert bid in ledger.sizes, f"batch {bid:#x} was never sent"
        assert bid not in stored, f"batch {bid:#x} stored twice"
        size = ledger.sizes[bid]
        part = msgs[i : i + size]
        got = [untag(x.payload) if not is_tick(x) else None for x in part]
        assert got == [(bid, k) for k in range(size)], f"batch {bid:#x} is not whole: {got}"
        stored[bid] = m.offset
        i += size
    for bid, offset in ledger.acked.items():
        assert bid in stored, f"acknowledged batch {bid:#x} is lost"
        assert stored[bid] == offset, f"batch {bid:#x} acked at {offset}, stored at {stored[bid]}"
    for pid, bids in ledger.order.items():  # one producer's batches keep their order
        placed = [stored[b] for b in bids if b in stored]
        assert placed == sorted(placed), f"producer {pid} batches out of order"
    return stored


@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_kill_9_during_produce_loses_nothing_acknowledged(
    start_node, pchannel, durability
) -> None:
    """async durability acknowledges once the OS has the write: that too survives kill -9."""
    ledger = Ledger()
    restarts: list[float] = []
    flags = ("--durability", durability)
    node = start_node("n1", *flags)
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
    rng = random.Random(7)
    for round_ in range(KILLS):
        stop = asyncio.Event()
        pumps = [
            asyncio.ensure_future(_pump(node.address, pchannel, pid, round_, ledger, stop))
            for pid in range(PRODUCERS)
        ]
        acked_before = len(ledger.acked)
        deadline = time.monotonic() + 15
        # Kill once this round has acknowledgements, a little later each time.
        while len(ledger.acked) < acked_before + 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        node.kill()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*pumps), 60)
        assert len(ledger.acked) > acked_before + 20, "producers made no progress"
        started = time.monotonic()
        node = start_node("n1", *flags)
        restarts.append(time.monotonic() - started)
        stored = _check_log(
            await _read_log(node.address, pchannel), ledger, dense=durability == "sync"
        )
        assert len(stored) >= len(ledger.acked)
    # The pchannel still takes appends after all that, right after the old end.
    async with NodeClient(node.address) as c:
        producer = await c.producer(pchannel, 1)
        r = await producer.send(tagged(0xFFFFFF, 0))
        await producer.close()
    msgs = await _read_log(node.address, pchannel)
    assert msgs[-1].offset == r.offset and msgs[-1].payload == tagged(0xFFFFFF, 0)
    print(
        f"batches acked {len(ledger.acked)}, stored unacked {len(set(stored) - set(ledger.acked))}"
        f", sent {len(ledger.sizes)}, restarts {[round(s, 2) for s in restarts]} s"
    )


async def test_terms_and_fences_survive_restart(start_node, pchannel) -> None:
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 3)
        producer = await c.producer(pchannel, 3)
        before = await producer.send_many([b"x", b"y"])
        await producer.close()
    node.kill()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        with pytest.raises(IgnoredOperation, match="term 3 already accepted"):
            await c.assign(pchannel, 2)
        await c.assign(pchannel, 3)  # same term: idempotent
        with pytest.raises(UnmatchedChannelTerm):
            await c.producer(pchannel, 2)
        producer = await c.producer(pchannel, 3)
        after = await producer.send(b"z")
        await producer.close()
        assert after.offset > before[-1].offset
        assert after.time_tick > before[-1].time_tick
        await c.remove(pchannel, 3)
    node.kill()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        with pytest.raises(ChannelFenced):
            await c.producer(pchannel, 3)
        with pytest.raises(ChannelFenced):
            await c.consumer(pchannel, 3)
        with pytest.raises(IgnoredOperation, match="released"):
            await c.assign(pchannel, 3)
        await c.assign(pchannel, 4)
        producer = await c.producer(pchannel, 4)
        later = await producer.send(b"w")
        await producer.close()
        assert later.offset > after.offset and later.time_tick > after.time_tick
        consumer = await c.consumer(pchannel, 4, DeliverPolicy.all())
        data = await read_data(consumer, 4)
        await consumer.close()
    assert [m.payload for m in data] == [b"x", b"y", b"z", b"w"]
    assert [m.term for m in data] == [3, 3, 3, 4]


async def test_corrupt_record_on_disk_refuses_the_pchannel_until_the_loss_is_accepted(
    start_node, pchannel
) -> None:
    """A flipped bit in a stored record of a single copy: the node refuses to serve the
    pchannel (DATA_LOSS, naming the checksum), keeps serving the others, and serves it
    again only when told to accept the loss under a new term, above every offset it ever
    acknowledged: no offset is acknowledged twice."""
    from rocksdict import Options, Rdict

    from streamwal.errors import ChannelNotExist, DataLoss
    from streamwal.node.log_store import log_key

    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        await c.assign("healthy", 1)
        producer = await c.producer(pchannel, 1)
        good = await producer.send_many([b"good"] * 3)
        bad = await producer.send_many([b"doomed"] * 3)
        await producer.close()
        other = await c.producer("healthy", 1)
        await other.send(b"fine")
        await other.close()
    node.kill()
    db = Rdict(str(node.data_dir), Options(raw_mode=True))
    try:
        key = log_key(pchannel, bad[0].offset)
        value = bytearray(db[key])
        value[-3] ^= 0x10  # inside the payload of the doomed batch
        db[key] = bytes(value)
    finally:
        db.close()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        with pytest.raises(DataLoss, match="checksum"):
            await c.assign(pchannel, 1)
        await c.assign("healthy", 1)
        healthy = await c.consumer("healthy", 1, DeliverPolicy.all())
        assert (await read_data(healthy, 1))[0].payload == b"fine"
        await healthy.close()
        with pytest.raises(ChannelNotExist, match="not assigned again"):
            await c.producer(pchannel, 1)  # the refused Assign left it unserved
        await c.assign(pchannel, 2, accept_data_loss=True)
        producer = await c.producer(pchannel, 2)
        r = await producer.send(b"later")
        await producer.close()
        assert r.offset > bad[-1].offset  # never an offset acknowledged before
        consumer = await c.consumer(pchannel, 2, DeliverPolicy.all())
        got = await read_data(consumer, 4)
        assert [m.offset for m in got] == [*(g.offset for g in good), r.offset]
        assert got[-1].payload == b"later"
        await consumer.close()


async def test_graceful_stop_under_load_is_prompt_and_loses_nothing(start_node, pchannel) -> None:
    ledger = Ledger()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
    stop = asyncio.Event()
    pumps = [
        asyncio.ensure_future(_pump(node.address, pchannel, pid, 0, ledger, stop))
        for pid in range(2)
    ]
    deadline = time.monotonic() + 15
    while len(ledger.acked) < 50 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    started = time.monotonic()
    await asyncio.to_thread(node.stop, 15)
    took = time.monotonic() - started
    stop.set()
    await asyncio.wait_for(asyncio.gather(*pumps), 60)
    assert node.proc is not None and node.proc.returncode == 0, node.log_tail()
    assert took < 8, f"SIGTERM took {took:.1f} s"
    assert "Traceback" not in node.log_tail(20_000)
    node = start_node("n1")
    _check_log(await _read_log(node.address, pchannel), ledger)


async def test_paused_node_resumes_without_loss(start_node, pchannel) -> None:
    """A node frozen (SIGSTOP) mid-stream holds its clients; after SIGCONT all completes."""
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        producer = await c.producer(pchannel, 1)
        consumer = await c.consumer(pchannel, 1, DeliverPolicy.all())
        first = await producer.send_many([tagged(1, i) for i in range(10)])
        node.pause()
        try:
            during = asyncio.ensure_future(producer.send_many([tagged(2, i) for i in range(10)]))
            await asyncio.sleep(1.0)
            assert not during.done(), "a frozen node acknowledged an append"
        finally:
            node.resume()
        second = await asyncio.wait_for(during, 15)
        assert second[0].offset > first[-1].offset
        got = await read_data(consumer, 20, timeout=15)
        assert [untag(m.payload) for m in got] == [(1, i) for i in range(10)] + [
            (2, i) for i in range(10)
        ]
        await consumer.close()
        await producer.close()


async def test_restarted_node_waits_for_its_assignment(start_node, pchannel) -> None:
    """After a crash the coord may have moved the pchannel: the node must not serve it
    (not even under its old term) until it is assigned again."""
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 2)
        producer = await c.producer(pchannel, 2)
        first = await producer.send(b"before")
        await producer.close()
    node.kill()
    node = start_node("n1")
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        assert [ch.pchannel.name for ch in (await c.collect_status()).channels] == []
        with pytest.raises(ChannelNotExist, match="recovering"):
            await c.producer(pchannel, 2)
        with pytest.raises(ChannelNotExist, match="recovering"):
            await c.consumer(pchannel, 2)
        await c.assign(pchannel, 2)  # same term: resumes, no new term history
        status = (await c.collect_status()).channels
        assert [(s.pchannel.name, s.pchannel.term) for s in status] == [(pchannel, 2)]
        producer = await c.producer(pchannel, 2)
        after = await producer.send(b"after")
        await producer.close()
        assert after.offset > first.offset
