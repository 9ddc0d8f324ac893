"""Term fencing against a real node: a stale owner can never append or read."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from streamwal.client.policy import DeliverPolicy
from streamwal.coord.node_link import NodeLinks
from streamwal.errors import (
    ChannelFenced,
    ChannelNotExist,
    IgnoredOperation,
    StreamingError,
    Unavailable,
    UnmatchedChannelTerm,
)
from streamwal.grpc_errors import from_trailing
from streamwal.node.peer import fetch
from streamwal.proto import streaming_pb2 as pb
from tests.node.helpers import RawConsumer, RawProducer, read_data


async def test_stale_and_future_terms_are_rejected_at_open(client, node, pchannel) -> None:
    await client.assign(pchannel, 5)
    for term in (4, 1, 6):
        with pytest.raises(UnmatchedChannelTerm, match=f"term {term}"):
            await client.producer(pchannel, term)
        with pytest.raises(UnmatchedChannelTerm):
            await client.consumer(pchannel, term)
    # A seed-style client sees the gRPC status and the StreamingError in trailing metadata.
    raw = RawProducer(node.address, pchannel, 4)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw.call.read()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "stale" in info.value.details()
    err = from_trailing(info.value.trailing_metadata())
    assert isinstance(err, UnmatchedChannelTerm)


async def test_unknown_pchannel_is_channel_not_exist(client, node) -> None:
    with pytest.raises(ChannelNotExist, match="never assigned"):
        await client.producer("nowhere", 1)
    with pytest.raises(ChannelNotExist):
        await client.consumer("nowhere", 1)
    with pytest.raises(ChannelNotExist):
        await client.remove("nowhere", 1)
    raw = RawConsumer(node.address, "nowhere", 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw.call.read()
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    await _batched_calls_answer_each_pchannel(node.address)


async def _batched_calls_answer_each_pchannel(address: str) -> None:
    """The coord's calls made together go in one StreamingNodeBatchService call per node
    (coord/node_link.py); each pchannel still gets its own answer or error."""
    links = NodeLinks()
    try:
        names = ["batch-a", "batch-b", "batch-c"]
        await asyncio.gather(*(links.assign(address, n, 3, 5.0) for n in names))
        fences = [links.fence(address, n, 4, 5.0) for n in names]
        fences.append(links.fence(address, "batch\ta", 4, 5.0))  # not a valid name
        *reports, bad = await asyncio.gather(*fences, return_exceptions=True)
        assert isinstance(bad, StreamingError) and not isinstance(bad, Unavailable), bad
        assert all(isinstance(r, pb.FenceResponse) for r in reports), reports
        outcomes = await asyncio.gather(
            links.assign(address, "batch-a", 2, 5.0),  # below the fence: ignored
            links.assign(address, "batch-b", 4, 5.0),
            links.remove(address, "batch-c", 4, 5.0),
            links.remove(address, "batch-nowhere", 1, 5.0),
            return_exceptions=True,
        )
        assert [type(o) for o in outcomes] == [IgnoredOperation, type(None), type(None),
                                               ChannelNotExist]  # fmt: skip
        status = await links.collect_status(address, 5.0)
        terms = {c.pchannel.name: c.pchannel.term for c in status.channels}
        assert terms.get("batch-b") == 4 and "batch-c" not in terms, terms
        assert not links._unbatched  # the node served them as batches, not one by one
    finally:
        await links.close()


async def test_assign_lower_term_is_ignored_and_same_term_idempotent(client, pchannel) -> None:
    await client.assign(pchannel, 2)
    producer = await client.producer(pchannel, 2)
    first = await producer.send(b"a")
    await client.assign(pchannel, 2)  # idempotent: the open producer keeps working
    await client.assign(pchannel, 2)
    second = await producer.send(b"b")
    assert second.offset > first.offset
    with pytest.raises(IgnoredOperation, match="term 2 already accepted"):
        await client.assign(pchannel, 1)
    with pytest.raises(IgnoredOperation, match="term must be >= 1"):
        await client.assign(pchannel + "x", 0)
    third = await producer.send(b"c")  # the ignored assign changed nothing
    assert third.offset > second.offset
    await producer.close()
    status = await client.collect_status()
    (st,) = [s for s in status.channels if s.pchannel.name == pchannel]
    assert st.pchannel.term == 2


async def test_higher_term_fences_an_open_producer_and_consumer(client, pchannel) -> None:
    await client.assign(pchannel, 1)
    old = await client.producer(pchannel, 1)
    before = await old.send(b"old-term")
    old_consumer = await client.consumer(pchannel, 1, DeliverPolicy.all())
    assert (await read_data(old_consumer, 1))[0].payload == b"old-term"
    await client.assign(pchannel, 2)
    with pytest.raises(UnmatchedChannelTerm, match="term 1 is stale"):
        await asyncio.wait_for(old.send(b"stale"), 10)
    with pytest.raises(StreamingError):  # the open consumer under term 1 is cut off too
        await read_data(old_consumer, 1, timeout=10)
    new = await client.producer(pchannel, 2)
    r = await new.send(b"new-term")
    assert r.offset > before.offset and r.time_tick > before.time_tick
    consumer = await client.consumer(pchannel, 2, DeliverPolicy.all())
    got = await read_data(consumer, 2)
    assert [(m.payload, m.term) for m in got] == [(b"old-term", 1), (b"new-term", 2)]
    await consumer.close()
    await new.close()
    await old.close()


async def test_reassign_while_a_producer_is_busy_completes_promptly(client, pchannel) -> None:
    """Failover must not wait for a stale producer that keeps sending."""
    await client.assign(pchannel, 1)
    producer = await client.producer(pchannel, 1)
    stop = asyncio.Event()
    acked: list[int] = []
    errors: list[StreamingError] = []

    async def pump() -> None:
        pending: set[asyncio.Task] = set()
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            pending.add(asyncio.ensure_future(producer.send_many([b"p" * 100] * 50)))
            if len(pending) >= 8:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.exception():
                        errors.append(t.exception())
                        return
                    acked.append(t.result()[-1].offset)
        if pending:
            done, _ = await asyncio.wait(pending, timeout=10)
            errors.extend(t.exception() for t in done if t.exception())

    task = asyncio.ensure_future(pump())
    while len(acked) < 20:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    try:
        await asyncio.wait_for(client.assign(pchannel, 2), 10)
        took = time.monotonic() - started
        # The stale producer keeps going until the node turns it away.
        await asyncio.wait_for(asyncio.shield(task), 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert took < 2.0, f"assign took {took:.2f} s while a stale producer was busy"
    assert errors and isinstance(errors[0], UnmatchedChannelTerm)
    status = await client.collect_status()
    (st,) = [s for s in status.channels if s.pchannel.name == pchannel]
    assert st.pchannel.term == 2 and st.next_offset > max(acked)


async def test_remove_fences_producers_and_consumers(client, node, pchannel) -> None:
    await client.assign(pchannel, 3)
    producer = await client.producer(pchannel, 3)
    await producer.send(b"before")
    consumer = await client.consumer(pchannel, 3, DeliverPolicy.all())
    assert (await read_data(consumer, 1))[0].payload == b"before"
    raw = RawConsumer(node.address, pchannel, 3, DeliverPolicy.latest())
    await raw.open()
    with pytest.raises(IgnoredOperation, match="serving term 3"):
        await client.remove(pchannel, 2)
    await client.remove(pchannel, 3)
    with pytest.raises(ChannelFenced):
        await asyncio.wait_for(producer.send(b"after"), 10)
    with pytest.raises(ChannelFenced):  # a caught-up consumer learns it without new data
        await read_data(consumer, 1, timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        for _ in range(100):
            await raw.next(10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert isinstance(from_trailing(info.value.trailing_metadata()), ChannelFenced)
    with pytest.raises(ChannelFenced, match="moved away or was removed"):
        await client.producer(pchannel, 3)
    with pytest.raises(ChannelFenced):
        await client.consumer(pchannel, 3)
    with pytest.raises(ChannelNotExist):
        await client.remove(pchannel, 3)  # already released
    status = await client.collect_status()
    assert pchannel not in [s.pchannel.name for s in status.channels]


async def _log_end(address: str, pchannel: str) -> int:
    """Where the node's log of `pchannel` ends, read with Fetch (any role, any fence)."""
    stream = fetch(address, pchannel, 0)
    try:
        return (await anext(stream)).log_end
    finally:
        await stream.aclose()


async def test_the_old_term_is_served_by_nobody_while_a_new_one_is_being_taken(
    client, node, pchannel
) -> None:
    """An Assign to a higher term may wait (here: catching up from a source that never
    answers). Meanwhile a producer of the old term must not append, and neither may
    the node's idle TimeTick: on a follower-to-be such a record under the old term is
    one its new leader cannot tell from its own, a silently divergent replica (seen
    once in the replication fault test)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never speaks HTTP/2
    try:
        await client.assign(pchannel, 1)
        old = await client.producer(pchannel, 1)
        await old.send(b"term 1")
        source = f"127.0.0.1:{silent.getsockname()[1]}"
        taking = asyncio.ensure_future(client.assign(pchannel, 2, catch_up_from=source))
        await asyncio.sleep(0.1)
        end = await _log_end(node.address, pchannel)
        await asyncio.sleep(0.6)  # three idle time-tick periods into the catch-up
        assert not taking.done()
        with pytest.raises(UnmatchedChannelTerm, match="is taking term 2"):
            await asyncio.wait_for(old.send(b"stale"), 10)
        assert await _log_end(node.address, pchannel) == end  # no TimeTick, no message
        with pytest.raises(StreamingError):  # the silent source fails the catch-up
            await taking
    finally:
        silent.close()
