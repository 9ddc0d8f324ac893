"""A follower's choice of transport (node/replication_links.py), against a stand-in that
answers only Describe: the leader's replication port when it answers, gRPC Replicate on
the internal listener when the port named is closed or none is named; a port link's
hold on reading while its follower is behind. No node process: the streams themselves
are covered by tests/replication/test_node_replication.py."""

from __future__ import annotations

import socket

import grpc
import pytest

from streamwal import wire
from streamwal.errors import ChannelFenced
from streamwal.node import replication_links
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import wire_pb2
from streamwal.transport import bind, make_server


async def _describing(answer: wire_pb2.DescribeNodeResponse):
    async def describe(_request, _context) -> wire_pb2.DescribeNodeResponse:
        return answer

    server = make_server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "streamwal.wire.StreamingNodeInfoService",
                {
                    "Describe": grpc.unary_unary_rpc_method_handler(
                        describe,
                        wire_pb2.DescribeNodeRequest.FromString,
                        wire_pb2.DescribeNodeResponse.SerializeToString,
                    )
                },
            )
        ]
    )
    port = bind(server, "127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


async def test_a_follower_takes_the_port_when_it_answers_and_grpc_otherwise() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        open_port = listening.getsockname()[1]
        cases = [
            (open_port, replication_links.WireLink),
            (_closed_port(), replication_links._GrpcLink),  # named, but refused: gRPC
            (0, replication_links._GrpcLink),  # none (--replication-listen off, TLS)
        ]
        for port, kind in cases:
            server, address = await _describing(
                wire_pb2.DescribeNodeResponse(server_id=1, replication_port=port)
            )
            try:
                link = await replication_links.open_link(address)
                try:
                    assert isinstance(link, kind), (port, link)
                    if isinstance(link, replication_links.WireLink):
                        _assert_keeps_alive(link.transport.get_extra_info("socket"))
                finally:
                    await link.close()
            finally:
                await server.stop(None)


def _assert_keeps_alive(sock) -> None:
    """A silent leader is given up as gRPC's keepalive would (10 s idle + 5 s), so the
    follower reconnects after a partition heals instead of waiting out TCP's retries."""
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        pytest.skip("not Linux")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15_000
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10


class _Transport:
    """What WireLink uses of a transport: reading paused and resumed, acks written."""

    def __init__(self) -> None:
        self.paused = False
        self.written: list[bytes] = []

    def get_extra_info(self, _name: str) -> None:
        return None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_a_wire_link_stops_reading_while_the_follower_holds_a_queue_full() -> None:
    """Entries go to the sink as they are cut, QUEUE at a time; while the sink says it
    holds too much the link reads nothing more (TCP holds the leader back) and hands over
    nothing, until `took`; the leader's ERROR frame ends the stream after the entries
    before it."""
    queue = replication_links.QUEUE
    link = replication_links.WireLink()
    transport = _Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    got: list[list] = []
    room = [False]

    def sink(items: list) -> bool:
        got.append(items)
        return room[0]

    entries = [pb.LogEntry(term=1, offset=i, record=b"r") for i in range(2 * queue + 3)]
    error = ChannelFenced("fenced")
    data = b"".join(wire.frame(wire.LOG_ENTRY, e.SerializeToString()) for e in entries)
    data += wire.frame(wire.ERROR, error.to_proto().SerializeToString())
    link.data_received(data)  # before `start`: kept
    assert not got and not transport.paused
    link.start(sink)
    assert [len(g) for g in got] == [queue] and transport.paused
    link.took()
    assert [len(g) for g in got] == [queue, queue] and transport.paused
    room[0] = True
    link.took()
    assert [len(g) for g in got] == [queue, queue, 4] and not transport.paused
    offsets = [e.offset for g in got for e in g if isinstance(e, pb.LogEntry)]
    assert offsets == list(range(2 * queue + 3))  # all of them, in order
    assert isinstance(got[-1][-1], ChannelFenced) and "fenced" in str(got[-1][-1])
    link.send(pb.ReplicaAck(pchannel="ch", term=1, acked_offset=5))
    assert transport.written  # acks go out at once, never held back
