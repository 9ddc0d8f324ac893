"""A limit on everything (node/limits.py, docs/limits.md), against real node processes.

What a hostile or broken caller can hold is bounded: frames that claim huge sizes and
never finish, thousands of idle or silent connections, too many connections from one
address or calls on one connection. Each is refused with RESOURCE_EXHAUSTED naming its
flag, counted in `streamwal_limit_exceeded_total`, and the node keeps serving the others
(a bystander) with its memory bounded. Limits are set through their STREAMWAL_NODE_*
variables (the same as the flags), which a node that lacks them ignores: on such a node
these tests fail on the defect itself, not on a flag it does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import struct
import time
from pathlib import Path

import grpc
import pytest

from streamwal import wire
from streamwal.client.node_client import NodeClient
from streamwal.errors import ResourceExhausted, StreamingError
from streamwal.proto import streaming_pb2 as pb
from streamwal.testing.local_node import free_port
from tests.node.helpers import read_log, sample, scrape, served_throughout

MIB = 1024 * 1024


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _header(pchannel: str, term: int = 1) -> bytes:
    req = pb.CreateProducerRequest(pchannel=pb.PChannelInfo(name=pchannel, term=term))
    return wire.frame(wire.CREATE_PRODUCER, req.SerializeToString())


async def _error_frame(reader: asyncio.StreamReader, timeout: float = 20.0) -> StreamingError:
    """The ERROR frame a refused connection gets before the node closes it."""
    while True:
        got = await asyncio.wait_for(wire.read_frame(reader), timeout)
        assert got is not None, "closed without an error frame"
        if got[0] == wire.ERROR:
            return StreamingError.from_proto(pb.StreamingError.FromString(got[1]))


async def _partial_frame(port: int, claim: int, send: int) -> StreamingError | None:
    """A producer header, then `send` bytes of a frame claiming `claim` bytes; waits for
    the node's verdict (an error, or a connection held until we give up) and leaves."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_header("big") + struct.pack(">IB", claim, wire.PRODUCE_REQUEST))
        chunk = b"x" * MIB
        for _ in range(send // MIB):
            writer.write(chunk)
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(writer.drain(), 10)
        try:
            return await _error_frame(reader, 3.0)
        except TimeoutError:
            return None  # held: its bytes count against the receive buffer
    except ConnectionError:
        return None
    finally:
        writer.close()


async def test_partial_huge_frames_leave_memory_bounded(start_node) -> None:
    """100 connections that send most of a huge frame, then leave: they used to leave
    ~250 MB of RSS each, never freed. A frame over --max-frame-size is refused from its
    header; frames within it share --max-receive-buffer, beyond which they are refused."""
    port = free_port()
    node = start_node("big", "--metrics", f"127.0.0.1:{port}")
    async with NodeClient(node.address) as c, served_throughout(c):
        await c.assign("big", 1)
        produce_port = (await c.describe()).produce_port
        baseline = _rss_mib(node.proc.pid)
        peak = baseline
        huge = [_partial_frame(produce_port, 256 * MIB, 4 * MIB) for _ in range(50)]
        within = [_partial_frame(produce_port, 15 * MIB, 12 * MIB) for _ in range(50)]
        tasks = [asyncio.ensure_future(t) for t in huge + within]
        while not all(t.done() for t in tasks):
            peak = max(peak, _rss_mib(node.proc.pid))
            await asyncio.sleep(0.05)
        verdicts = [t.result() for t in tasks]
        await asyncio.sleep(0.5)
        after = _rss_mib(node.proc.pid)
        assert all(
            isinstance(v, ResourceExhausted) and "--max-frame-size" in str(v) for v in verdicts[:50]
        ), verdicts[:50]
        refused = [v for v in verdicts[50:] if v is not None]
        assert refused and all("--max-receive-buffer" in str(v) for v in refused), refused
        assert peak - baseline < 150, (baseline, peak)
        assert after - baseline < 150, (baseline, after)
        producer = await c.producer("big", 1)  # and the port still serves producers
        await producer.send(b"after")
        await producer.close()
        assert [m.payload for m in await read_log(c, "big", 1)] == [b"after"]
    samples = scrape(port)
    assert sample(samples, "streamwal_limit_exceeded_total", limit="frame_size") == 50
    assert sample(samples, "streamwal_limit_exceeded_total", limit="receive_buffer") >= len(refused)


def _raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _open_many(port: int, count: int, first: bytes = b"") -> list:
    """`count` connections (in waves, as a listen backlog takes them), each having sent
    `first`."""
    conns = []
    for start in range(0, count, 250):
        wave = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", port) for _ in range(min(250, count - start)))
        )
        for _, writer in wave:
            if first:
                writer.write(first)
        conns += wave
    return conns


async def _closed_by_node(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the node sent until it closed the connection."""
    return await asyncio.wait_for(reader.read(), timeout)


async def test_thousands_of_idle_connections_are_reclaimed_and_new_clients_get_in(
    start_node, pchannel
) -> None:
    """5,000 connections that say nothing (or only their header) used to be held for
    ever, and at the file limit new clients were locked out. The header and idle
    timeouts close them (500 silent ones on the gRPC port too); a new client is served
    meanwhile and after."""
    _raise_open_files(12_500)
    port = free_port()
    node = start_node(
        "idle",
        "--metrics", f"127.0.0.1:{port}",
        env={
            "STREAMWAL_NODE_HEADER_TIMEOUT": "1s",
            "STREAMWAL_NODE_IDLE_TIMEOUT": "2s",
            "STREAMWAL_NODE_MAX_CONNECTIONS": "8000",
            "STREAMWAL_NODE_MAX_CONNECTIONS_PER_PEER": "8000",
        },
    )  # fmt: skip
    async with NodeClient(node.address) as c, served_throughout(c):
        await c.assign(pchannel, 1)
        produce_port = (await c.describe()).produce_port
        started = time.monotonic()
        silent = await _open_many(produce_port, 2500)
        headed = await _open_many(produce_port, 2500, _header(pchannel))
        on_grpc = await _open_many(node.port, 500)  # no HTTP/2 handshake: gRPC's timeout
        producer = await c.producer(pchannel, 1)  # served while they are held
        await producer.send(b"during")
        await producer.close()
        everyone = silent + headed + on_grpc
        closed = await asyncio.gather(
            *(_closed_by_node(r, 60) for r, _ in everyone), return_exceptions=True
        )
        reclaimed_s = time.monotonic() - started
        for _, writer in everyone:
            writer.close()
        assert not [e for e in closed if isinstance(e, BaseException)][:3]
        silent_got = [_last_frame(data) for data in closed[:2500]]
        assert all("--header-timeout" in got for got in silent_got), silent_got[:3]
        # An idle producer's stream is closed as a clean close, which producers take as
        # "open another stream on the next send" (docs/decisions-edge.md).
        headed_got = {_last_frame(data) for data in closed[2500:5000]}
        assert headed_got == {"close"}, headed_got
        assert reclaimed_s < 60
        producer = await c.producer(pchannel, 1)
        await producer.send(b"after")
        await producer.close()
        assert [m.payload for m in await read_log(c, pchannel, 1)] == [b"during", b"after"]
    samples = scrape(port)
    assert sample(samples, "streamwal_limit_exceeded_total", limit="header_timeout") == 2500
    assert sample(samples, "streamwal_limit_exceeded_total", limit="idle_timeout") >= 2500
    assert sample(samples, "streamwal_limit", limit="idle_timeout") == 2.0
    assert sample(samples, "streamwal_limit", limit="connections") == 8000
    assert sample(samples, "streamwal_limit_usage", limit="connections") <= 2


def _last_frame(data: bytes) -> str:
    """What the last frame in `data` was: an ERROR frame's cause, or the kind of answer."""
    last, pos = "", 0
    while pos + wire.HEAD_BYTES <= len(data):
        length, kind = struct.unpack_from(">IB", data, pos)
        body = data[pos + wire.HEAD_BYTES : pos + wire.HEAD_BYTES + length]
        if kind == wire.ERROR:
            last = str(StreamingError.from_proto(pb.StreamingError.FromString(body)))
        else:
            last = pb.ProduceResponse.FromString(body).WhichOneof("response")
        pos += wire.HEAD_BYTES + length
    return last


async def test_connections_per_peer_and_calls_per_connection(start_node, pchannel) -> None:
    """One address cannot take a listener's connections, nor one connection its calls:
    the next gets RESOURCE_EXHAUSTED naming the limit; other addresses are served."""
    port = free_port()
    node = start_node(
        "peers",
        "--metrics",
        f"127.0.0.1:{port}",
        env={
            "STREAMWAL_NODE_MAX_CONNECTIONS_PER_PEER": "3",
            "STREAMWAL_NODE_MAX_STREAMS_PER_CONNECTION": "4",
        },
    )
    async with NodeClient(node.address) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        produce_port = (await c.describe()).produce_port
        held = await _open_many(produce_port, 3, _header(pchannel))
        reader, writer = await asyncio.open_connection("127.0.0.1", produce_port)
        err = await _error_frame(reader)
        writer.close()
        assert isinstance(err, ResourceExhausted) and "--max-connections-per-peer" in str(err)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", produce_port, local_addr=("127.0.0.2", 0)
        )
        writer.write(_header(pchannel))
        first = await asyncio.wait_for(wire.read_frame(reader), 10)
        assert first is not None and first[0] == wire.PRODUCE_RESPONSE  # another address: in
        writer.close()
        for _, w in held:
            w.close()
        # gRPC: a channel is one connection; its 5th open call is refused.
        consumers = [await c.consumer(pchannel, 1) for _ in range(4)]
        with pytest.raises(ResourceExhausted, match="--max-streams-per-connection"):
            await c.consumer(pchannel, 1)
        for _ in range(20):  # a closed consumer's slot is free when close returns
            await consumers.pop().close()
            consumers.append(await c.consumer(pchannel, 1))
        for consumer in consumers:
            await consumer.close()
    samples = scrape(port)
    assert sample(samples, "streamwal_limit_exceeded_total", limit="connections_per_peer") == 1
    assert sample(samples, "streamwal_limit_exceeded_total", limit="streams_per_connection") == 1


async def test_grpc_refuses_oversized_messages_from_their_length(start_node, pchannel) -> None:
    """A gRPC message over --max-frame-size is refused by gRPC from its length prefix;
    its body is never held (the node's memory does not grow by it)."""
    node = start_node("grpc-big", env={"STREAMWAL_NODE_MAX_FRAME_SIZE": "8MiB"})
    async with NodeClient(node.address, produce_port=False) as c:
        await c.wait_ready(30)
        await c.assign(pchannel, 1)
        baseline = _rss_mib(node.proc.pid)
        producer = await c.producer(pchannel, 1)
        with pytest.raises(StreamingError, match=r"RESOURCE_EXHAUSTED|larger than max"):
            await producer.send_many([b"x" * (2 * MIB)] * 6)  # 12 MiB in one frame
        assert _rss_mib(node.proc.pid) - baseline < 60
        await producer.abandon()
        producer = await c.producer(pchannel, 1)
        ok = await producer.send_many([b"y" * (4 * MIB - 64)])
        await producer.close()
        got = await read_log(c, pchannel, 1)
        assert [m.offset for m in got] == [ok[0].offset]


def test_grpc_status_of_a_limit() -> None:
    from streamwal.grpc_errors import status_for

    assert status_for(ResourceExhausted("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
