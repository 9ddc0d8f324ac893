"""A no-op StreamingNodeHandlerService: the gRPC + protobuf ceiling of the node's path.

It speaks the node's Produce / Consume protocol (batch frames included) but keeps the
frames it receives in a Python list instead of a WAL: no fsync, no RocksDB, no fencing.
Run as its own process (like the node) so client and server do not share a GIL:
    python -m streamwal.bench.noop_server --port PORT
Memory is bounded by what the benchmark sends; `Produce` to a name starting with "drop:"
forgets that channel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from grpc import aio

from streamwal import transport
from streamwal.ids import encode_offset
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg

PRODUCER_HEADER = "create-producer-bin"
CONSUMER_HEADER = "create-consumer-bin"


def _header(context: aio.ServicerContext, key: str) -> bytes:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v
    raise KeyError(key)


class _Log:
    """The in-memory log of one channel: (first offset, count, MessageBatch bytes)."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes]] = []
        self.next_offset = 0
        self.changed = asyncio.Event()

    def append(self, body: bytes, count: int) -> int:
        first = self.next_offset
        self.frames.append((first, count, body))
        self.next_offset += count
        self.changed.set()
        self.changed = asyncio.Event()
        return first


class NoopHandler(pbg.StreamingNodeHandlerServiceServicer):
    def __init__(self) -> None:
        self.logs: dict[str, _Log] = {}

    def _log(self, name: str) -> _Log:
        return self.logs.setdefault(name, _Log())

    async def Produce(self, request_iterator, context):
        info = pb.CreateProducerRequest.FromString(_header(context, PRODUCER_HEADER))
        name = info.pchannel.name
        if name.startswith("drop:"):
            self.logs.pop(name[5:], None)
            return
        log = self._log(name)
        yield pb.ProduceResponse(create=pb.CreateProducerResponse(producer_id=1))
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "produce_batch":
                body = req.produce_batch.messages
                count = len(pb.MessageBatch.FromString(body).messages)
                first = log.append(body, count)
                yield pb.ProduceResponse(
                    produce_batch=pb.ProduceBatchResponse(
                        request_id=req.produce_batch.request_id,
                        result=pb.ProduceBatchResult(
                            first_id=pb.MessageID(id=encode_offset(first)),
                            count=count,
                            first_time_tick=first + 1,
                        ),
                    )
                )
            elif kind == "produce":
                body = pb.MessageBatch(messages=[req.produce.message]).SerializeToString()
                first = log.append(body, 1)
                yield pb.ProduceResponse(
                    produce=pb.ProduceMessageResponse(
                        request_id=req.produce.request_id,
                        result=pb.ProduceMessageResponseResult(
                            id=pb.MessageID(id=encode_offset(first)), time_tick=first + 1
                        ),
                    )
                )
            else:
                yield pb.ProduceResponse(close=pb.CloseProducerResponse())
                return

    async def Consume(self, request_iterator, context):
        info = pb.CreateConsumerRequest.FromString(_header(context, CONSUMER_HEADER))
        log = self._log(info.pchannel.name)
        yield pb.ConsumeResponse(
            create=pb.CreateConsumerResponse(first_offset=0, next_offset=log.next_offset)
        )
        index = 0
        while True:
            while index < len(log.frames):
                first, _count, body = log.frames[index]
                index += 1
                yield pb.ConsumeResponse(
                    consume_batch=pb.ConsumeBatchResponse(
                        first_id=pb.MessageID(id=encode_offset(first)),
                        term=1,
                        first_time_tick=first + 1,
                        messages=body,
                    )
                )
            await log.changed.wait()


async def serve(port: int) -> None:
    server = transport.make_server()
    pbg.add_StreamingNodeHandlerServiceServicer_to_server(NoopHandler(), server)
    bound = transport.bind(server, f"127.0.0.1:{port}")
    await server.start()
    print(f"ready {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    with contextlib.suppress(Exception):
        await server.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="Loopback port to serve on.")
    import uvloop  # the node runs on uvloop too; the ceiling must not be handicapped

    uvloop.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
