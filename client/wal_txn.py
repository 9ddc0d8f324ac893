"""The accessor's transactions (seed 002's Txn) over the node transactions of client/txn.py.

A txn runs on the accessor's producer for the vchannel's pchannel, under the owner it
has when the txn begins: the node buffers the messages and appends them at commit as one
record with one time tick. A txn does not follow a failover (only committed data
survives one): calls after a move raise InvalidTransactionState, as the seed's "commit or
rollback exactly once" leaves no other honest answer.

    async with await wal.txn("pchannel_0_v1") as txn:   # commits, or rolls back on error
        await txn.append(Message("pchannel_0_v1", b"a"))
"""

from __future__ import annotations

from collections.abc import Callable

from streamwal.client.append import Message
from streamwal.client.txn import Txn, TxnResult
from streamwal.errors import InvalidArgument


class WALTxn:
    """One transaction on one vchannel; commit or roll back exactly once."""

    def __init__(self, inner: Txn, observe: Callable[[str, int], None]) -> None:
        self.inner = inner
        self._observe = observe
        self.result: TxnResult | None = None
        self._finished = False  # commit or rollback was called (once is all one gets)

    @property
    def vchannel(self) -> str:
        return self.inner.vchannel

    @property
    def txn_id(self) -> int:
        return self.inner.txn_id

    async def append(self, msg: Message | bytes) -> None:
        """Buffer one message at the node (a Message must name the txn's vchannel)."""
        if isinstance(msg, bytes | bytearray):
            msg = Message(self.vchannel, bytes(msg))
        if msg.vchannel != self.vchannel:
            raise InvalidArgument(
                f"txn {self.txn_id} writes {self.vchannel!r}, not {msg.vchannel!r}"
            )
        try:
            await self.inner.append(
                msg.payload, msg_type=int(msg.msg_type), properties=msg.properties
            )
        except ValueError as exc:  # a reserved property key
            raise InvalidArgument(str(exc)) from None

    async def commit(self, *, barrier_time_tick: int = 0) -> TxnResult:
        """Append every buffered message atomically, all with the commit's time tick
        (above `barrier_time_tick`)."""
        self._finished = True
        self.result = await self.inner.commit(barrier_time_tick=barrier_time_tick)
        self._observe(self.vchannel, self.result.time_tick)
        return self.result

    async def rollback(self) -> None:
        """Drop the buffered messages; none of them will ever be delivered."""
        self._finished = True
        await self.inner.rollback()

    async def __aenter__(self) -> WALTxn:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._finished:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()
