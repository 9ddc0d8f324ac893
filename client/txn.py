"""Transactions of the asyncio client (seed 002's Txn), begun with `Producer.begin_txn`.

The node buffers a txn's messages and appends them at commit as one record: consumers
see all of them together, contiguous, each with the commit's time tick, or none. A txn
travels on its producer's stream (ordered with its batches, one sequence number for the
commit, so a resent commit is answered instead of appended twice) and lives no longer
than that stream: a node restart, a term change or a broken stream loses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamwal.errors import InvalidTransactionState
from streamwal.ids import decode_offset
from streamwal.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from streamwal.client.producer import Producer


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a commit appended: `count` messages at `message_ids` (offsets, contiguous from
    `first_offset`), every one with the commit's `time_tick`."""

    message_ids: list[int]
    time_tick: int
    first_offset: int
    count: int


class Txn:
    """One open transaction on one vchannel; `commit` or `rollback` it exactly once.

    `append` buffers a message at the node (the same payload, message type and properties
    as `Producer.send` takes; the vchannel is the txn's). The node refuses an append past
    its per-txn byte limit (InvalidArgument; the txn stays usable) and expires a txn that
    sees no append for `keepalive` seconds: then `append` / `commit` raise
    TransactionExpired ("txn N expired ..."). A second commit or rollback, or any call
    after one, raises InvalidTransactionState, as does a txn lost to a node restart, a
    term change or a broken producer stream (only committed txns survive).
    """

    def __init__(self, producer: Producer, vchannel: str, txn_id: int, keepalive: float) -> None:
        self.vchannel = vchannel
        self.txn_id = txn_id
        self.keepalive = keepalive  # seconds, as the node applies it
        self._producer = producer
        self._count = 0
        self._state = "open"

    async def append(
        self,
        payload: bytes,
        *,
        msg_type: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """Buffer one message at the node; returns once the node holds it."""
        self._check_open("append to")
        entry = self._producer.encode(payload, self.vchannel, msg_type, properties)
        await self._producer.txn_request(
            pb.TxnRequest(append=pb.TxnAppend(txn_id=self.txn_id, messages=entry))
        )
        self._count += 1

    async def commit(self, *, barrier_time_tick: int = 0) -> TxnResult:
        """Append every buffered message atomically; returns once they are durable. The
        commit's time tick is above `barrier_time_tick` (0: no barrier)."""
        self._check_open("commit")
        self._state = "committed"
        resp = await self._producer.txn_request(
            pb.TxnRequest(
                commit=pb.TxnCommit(txn_id=self.txn_id, barrier_time_tick=barrier_time_tick)
            ),
            commit=True,
        )
        first = decode_offset(resp.committed.first_id.id)
        ids = list(range(first, first + self._count))
        return TxnResult(ids, resp.committed.time_tick, first, self._count)

    async def rollback(self) -> None:
        """Drop the buffered messages at the node; none of them will ever appear."""
        self._check_open("roll back")
        self._state = "rolled back"
        await self._producer.txn_request(pb.TxnRequest(rollback=pb.TxnRollback(txn_id=self.txn_id)))

    def _check_open(self, action: str) -> None:
        if self._state != "open":
            raise InvalidTransactionState(f"cannot {action} txn {self.txn_id}: {self._state}")
        err = self._producer.error
        if err is not None:
            self._state = "lost"
            raise InvalidTransactionState(
                f"txn {self.txn_id} is lost with its producer stream ({err}); "
                "only committed txns survive"
            )
