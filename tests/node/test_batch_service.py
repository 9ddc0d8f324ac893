"""The node's batch calls (StreamingNodeBatchService): items answered in their place, a
late one with an error of its own while the others keep their answers."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from streamwal.errors import ChannelNotExist, Inner
from streamwal.node.service import NodeService
from streamwal.proto import streaming_pb2 as pb


class _Context:
    def __init__(self, deadline_s: float) -> None:
        self._until = time.monotonic() + deadline_s

    def time_remaining(self) -> float:
        return max(0.0, self._until - time.monotonic())


async def test_a_late_item_gets_its_own_error_and_the_others_their_answers() -> None:
    async def fence(req: pb.FenceRequest) -> pb.FenceResponse:
        name = req.pchannel.name
        if name == "stuck":
            await asyncio.sleep(30)  # a pchannel whose pending write does not finish
        if name == "gone":
            raise ChannelNotExist(name)
        return pb.FenceResponse(next_offset=len(name))

    names = ["a", "stuck", "gone", "dddd"]
    request = pb.FenceBatchRequest(
        items=[pb.FenceRequest(pchannel=pb.PChannelInfo(name=n, term=2)) for n in names]
    )
    started = time.monotonic()
    node = SimpleNamespace(serving=True)
    done = await NodeService._batch(node, request, _Context(0.5), fence)  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert 0.3 < took < 0.5, took  # within the call's deadline, with a margin to answer
    first, stuck, gone, last = done
    assert first.next_offset == 1 and last.next_offset == 4
    assert isinstance(stuck, Inner) and "deadline" in str(stuck)
    assert isinstance(gone, ChannelNotExist)
