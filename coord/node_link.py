"""The coord's thin gRPC adapter to streaming nodes' manager service.

One channel per node, to its internal listener (found from the node's gRPC address by
`transport.internal_address`), built by `streamwal.transport`. Every call has a deadline so a dead
or hung node can never stall the coord; failures come back as typed errors:
`StreamingError` subclasses when the node answered with one (trailing metadata
`streaming-error-bin`), `Unavailable` when it did not answer at all. (The client's
NodeClient has no per-call deadlines, which the coord needs; hence these few stubs.)

Fences, assigns and removes go out in batches (issue 24): the calls made for one node
within `BATCH_WINDOW_S` of each other (a round's sagas reach the same step together)
travel as one StreamingNodeBatchService call, each caller still getting its own answer
or error. A node without that service (an older version) is called one item at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from streamwal import transport
from streamwal.errors import Inner, StreamingError
from streamwal.grpc_errors import from_rpc_error
from streamwal.proto import streaming_pb2 as pb
from streamwal.proto import streaming_pb2_grpc as pbg


@dataclass(frozen=True)
class _Stubs:
    """A node's services on its internal listener."""

    manager: pbg.StreamingNodeManagerServiceStub
    replication: pbg.StreamingNodeReplicationServiceStub  # Fence, one pchannel a call
    batch: pbg.StreamingNodeBatchServiceStub


def _answer(item: Any, field_name: str = "") -> Any:
    """A batch item as its caller gets it: the StreamingError it carries, else its
    answer (`field_name` of it; none for assign and remove)."""
    if isinstance(item, BaseException):  # a call of the one-at-a-time fallback
        return item if isinstance(item, StreamingError) else Inner(str(item))
    if not isinstance(item, pb.FenceBatchItem | pb.BatchResult):
        return item  # the fallback's own answer (a FenceResponse, ...)
    if item.HasField("error"):
        return StreamingError.from_proto(item.error)
    return getattr(item, field_name) if field_name else None


BATCH_WINDOW_S = 0.005  # calls for one node this close together share one batch call
MAX_BATCH = 512  # items per batch call (a few hundred bytes each)


@dataclass
class _Pending:
    """Items of one kind waiting to go to one node together."""

    requests: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    timeout: float = 0.0


# (address, requests, timeout) -> one answer or StreamingError per request, in order
SendBatch = Callable[[str, list[Any], float], Awaitable[list[Any]]]


class Coalescer:
    """Gathers the items of one kind per node and sends them with `send` in one call:
    those that arrive within `window` seconds of the first, at most `limit` per call.
    The call's deadline is the longest of its items' (they come from one round, with
    deadlines scaled to the round's calls per node)."""

    def __init__(self, send: SendBatch, window: float = BATCH_WINDOW_S, limit: int = MAX_BATCH):
        self._send = send
        self._window = window
        self._limit = limit
        self._pending: dict[str, _Pending] = {}
        self._tasks: set[asyncio.Task] = set()

    async def call(self, address: str, request: Any, timeout: float) -> Any:
        """Send `request` to `address` with the others gathered meanwhile; its answer
        (raises its StreamingError)."""
        loop = asyncio.get_running_loop()
        pending = self._pending.get(address)
        if pending is None:
            pending = self._pending[address] = _Pending()
            loop.call_later(self._window, self._flush, address, pending)
        future: asyncio.Future = loop.create_future()
        pending.requests.append(request)
        pending.futures.append(future)
        pending.timeout = max(pending.timeout, timeout)
        if len(pending.requests) >= self._limit:
            self._flush(address, pending)
        answer = await future
        if isinstance(answer, StreamingError):
            raise answer
        return answer

    def _flush(self, address: str, pending: _Pending) -> None:
        if self._pending.get(address) is not pending:
            return  # already sent (full)
        del self._pending[address]
        task = asyncio.get_running_loop().create_task(self._run(address, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, address: str, pending: _Pending) -> None:
        try:
            answers = await self._send(address, pending.requests, pending.timeout)
        except StreamingError as err:
            answers = [err] * len(pending.requests)
        except BaseException as err:  # no caller may wait for ever
            for future in pending.futures:
                if future.done():
                    continue
                if isinstance(err, Exception):
                    future.set_exception(err)  # a bug: every caller sees it
                else:
                    future.cancel()
            if not isinstance(err, Exception):
                raise
            return
        for future, answer in zip(pending.futures, answers, strict=True):
            if not future.done():  # its caller may have given up (cancelled)
                future.set_result(answer)


class NodeLinks:
    """Manager-service stubs for every node the coord knows, created lazily."""

    def __init__(self, config: transport.TransportConfig | None = None) -> None:
        self._config = config
        self._channels: dict[str, aio.Channel] = {}
        self._stubs: dict[str, _Stubs] = {}
        self._replaced = transport.Replaced()
        self._stale: set[str] = set()  # nodes whose next call goes on a new connection
        self._unbatched: set[str] = set()  # nodes without the batch service
        self._fences = Coalescer(self._fence_batch)
        self._assigns = Coalescer(self._assign_batch)
        self._removes = Coalescer(self._remove_batch)

    def reconnect(self, address: str) -> None:
        """The node at `address` answers again after it did not (the coord saw it come
        back): its next call goes on a new connection. A network partition leaves the
        old one resending at TCP's backed-off retransmission times, seconds after the
        partition healed; calls already running on it keep it until they end."""
        if address in self._channels:
            self._stale.add(address)

    async def _stub(self, address: str, timeout: float) -> _Stubs:
        if address in self._stale:
            self._stale.discard(address)
            await self._retire(address)
        stubs = self._stubs.get(address)
        if stubs is None:
            internal = await transport.internal_address(address, self._config, timeout)
            stubs = self._stubs.get(address)  # another call may have made it meanwhile
        if stubs is None:
            # its own connection, or a replacement would share the one it replaces
            channel = transport.make_channel(internal, self._config, own_connection=True)
            self._channels[address] = channel
            stubs = self._stubs[address] = _Stubs(
                pbg.StreamingNodeManagerServiceStub(channel),
                pbg.StreamingNodeReplicationServiceStub(channel),
                pbg.StreamingNodeBatchServiceStub(channel),
            )
        return stubs

    async def _call(self, address: str, service: str, method: str, request, timeout: float):
        try:
            stub = getattr(await self._stub(address, timeout), service)
            return await getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            await self._drop_if_failing(address)
            raise from_rpc_error(err) from None

    async def _batch(
        self, address: str, method: str, batch, service: str, requests: list, timeout: float
    ) -> list:
        """One batch call (`batch` holds `requests`); its reply's items. A node without
        the batch service gets the requests one call each (`service`.`method`)."""
        if address not in self._unbatched:
            try:
                stubs = await self._stub(address, timeout)
                reply = await getattr(stubs.batch, method)(batch, timeout=timeout)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    await self._drop_if_failing(address)
                    raise from_rpc_error(err) from None
                self._unbatched.add(address)
            else:
                if len(reply.items) != len(requests):
                    raise Inner(f"{address} answered {len(reply.items)} of {len(requests)} items")
                return list(reply.items)
        calls = (self._call(address, service, method, r, timeout) for r in requests)
        return list(await asyncio.gather(*calls, return_exceptions=True))

    async def _fence_batch(self, address: str, requests: list, timeout: float) -> list:
        batch = pb.FenceBatchRequest(items=requests)
        items = await self._batch(address, "Fence", batch, "replication", requests, timeout)
        return [_answer(item, "response") for item in items]

    async def _assign_batch(self, address: str, requests: list, timeout: float) -> list:
        batch = pb.AssignBatchRequest(items=requests)
        items = await self._batch(address, "Assign", batch, "manager", requests, timeout)
        return [_answer(item) for item in items]

    async def _remove_batch(self, address: str, requests: list, timeout: float) -> list:
        batch = pb.RemoveBatchRequest(items=requests)
        items = await self._batch(address, "Remove", batch, "manager", requests, timeout)
        return [_answer(item) for item in items]

    async def _drop_if_failing(self, address: str) -> None:
        """Replace a node's channel that is in TRANSIENT_FAILURE: a node restarted there
        listens on a new internal port (asked anew with the next call's Describe), and
        the fresh channel connects at once, not after gRPC's reconnect backoff."""
        channel = self._channels.get(address)
        if channel is None:
            return
        if channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        if not self._replaced.due(address, time.monotonic()):
            return
        self._unbatched.discard(address)  # a node restarted there may be a newer version
        await self._retire(address)

    async def _retire(self, address: str) -> None:
        """Drop `address`'s channel (calls running on it keep it) and stubs: the next call
        opens a new one. Once: a node marked for `reconnect` may have had its failing
        channel dropped meanwhile, and the other way round."""
        self._stubs.pop(address, None)
        channel = self._channels.pop(address, None)
        if channel is not None:
            await self._replaced.retire(channel, time.monotonic())

    async def assign(
        self,
        address: str,
        name: str,
        term: int,
        timeout: float,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
        retention: pb.RetentionPolicy | None = None,
    ) -> None:
        """Assign `name` at `term`; the node first copies what it lacks from `catch_up_from`.

        With `replica_set` the node leads or follows under `term` (replication); with
        `retention` it applies that policy (else it keeps the pchannel's current one)."""
        request = pb.StreamingNodeManagerAssignRequest(
            pchannel=pb.PChannelInfo(name=name, term=term),
            catch_up_from=catch_up_from,
            min_next_offset=min_next_offset,
            replica_set=replica_set,
            accept_data_loss=accept_data_loss,
            retention=retention,
        )
        await self._assigns.call(address, request, timeout)

    async def fence(self, address: str, name: str, term: int, timeout: float) -> pb.FenceResponse:
        """Raise `name`'s accepted term on the node to `term`; returns its log's end."""
        request = pb.FenceRequest(pchannel=pb.PChannelInfo(name=name, term=term))
        return await self._fences.call(address, request, timeout)

    async def remove(self, address: str, name: str, term: int, timeout: float) -> None:
        request = pb.StreamingNodeManagerRemoveRequest(
            pchannel=pb.PChannelInfo(name=name, term=term)
        )
        await self._removes.call(address, request, timeout)

    async def collect_status(
        self, address: str, timeout: float
    ) -> pb.StreamingNodeManagerCollectStatusResponse:
        request = pb.StreamingNodeManagerCollectStatusRequest()
        return await self._call(address, "manager", "CollectStatus", request, timeout)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        await self._replaced.close()
        self._stubs.clear()
