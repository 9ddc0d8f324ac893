"""Message vocabulary shared by node and client: reserved property keys and MsgType codes.

Keys and codes are Milvus's (seed 001), so tools built for Milvus read our messages.
Property values are decimal strings; keys starting with "_" are reserved for the system.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

PROP_TYPE = "_t"  # MsgType code; absent means Insert
PROP_TIME_TICK = "_tt"  # set by the node on delivery
PROP_VCHANNEL = "_vc"  # set by the producer
PROP_TERM = "_wt"  # set by the node on delivery
PROP_BROADCAST_ID = "_bid"  # set by the coord on every copy of a broadcast (decimal id)
RESERVED_PREFIX = "_"


class MsgType(IntEnum):
    Undefined = 0
    CreateCollection = 100
    DropCollection = 101
    HasCollection = 102
    DescribeCollection = 103
    ShowCollections = 104
    GetSystemConfigs = 105
    LoadCollection = 106
    ReleaseCollection = 107
    CreateAlias = 108
    DropAlias = 109
    AlterAlias = 110
    CreatePartition = 200
    DropPartition = 201
    HasPartition = 202
    DescribePartition = 203
    ShowPartitions = 204
    LoadPartitions = 205
    ReleasePartitions = 206
    ShowSegments = 250
    DescribeSegment = 251
    LoadSegments = 252
    ReleaseSegments = 253
    HandoffSegments = 254
    LoadBalanceSegments = 255
    CreateIndex = 300
    DescribeIndex = 301
    DropIndex = 302
    Insert = 400
    Delete = 401
    Flush = 402
    Search = 500
    SearchResult = 501
    GetIndexState = 502
    GetIndexBuildProgress = 503
    GetCollectionStatistics = 504
    GetPartitionStatistics = 505
    Retrieve = 506
    RetrieveResult = 507
    WatchDmChannels = 508
    RemoveDmChannels = 509
    WatchQueryChannels = 510
    RemoveQueryChannels = 511
    SegmentInfo = 600
    TimeTick = 1200
    QueryNodeStats = 1201
    LoadIndex = 1202
    RequestID = 1203
    RequestTSO = 1204
    AllocateSegment = 1205
    SegmentStatistics = 1206
    SegmentFlushDone = 1207
    DataNodeTt = 1208
    # Transactions: the codes of Milvus's streaming MessageType (messages.proto), which
    # seed 001's MsgType leaves free. The node writes no marker messages (a committed txn
    # is one record whose messages share the commit's tick, node/records.py); the codes
    # are for layers above that want to tag or group txn messages.
    BeginTxn = 900
    CommitTxn = 901
    RollbackTxn = 902
    Txn = 999


DEFAULT_MSG_TYPE = MsgType.Insert
MAX_MSG_TYPE = 2**31 - 1  # Milvus's MsgType is an int32


def msg_type_of(raw: str | None) -> int:
    """The MsgType code a `_t` value holds; absent or empty means Insert.

    Raises ValueError unless it is 1 to 10 ASCII digits up to MAX_MSG_TYPE: the node
    refuses such a value at the edge, and readers refuse one already stored with this
    error instead of crashing.
    """
    if not raw:
        return int(DEFAULT_MSG_TYPE)
    if len(raw) > 10 or not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_MSG_TYPE:
        raise ValueError(
            f"property {PROP_TYPE} is {raw[:40]!r}, not a message type code "
            f"(1 to 10 digits, at most {MAX_MSG_TYPE})"
        )
    return int(raw)


def pchannel_of(vchannel: str) -> str:
    """The pchannel a vchannel lives on: Milvus names vchannels `<pchannel>_<suffix>`."""
    head, sep, _ = vchannel.rpartition("_")
    return head if sep and head else vchannel


@dataclass(frozen=True, slots=True)
class ResourceKey:
    """Something a broadcast works on (seed 002's message.ResourceKey); exclusive unless
    `shared`. Held from the broadcast's append until it is acked on every vchannel."""

    domain: str
    key: str
    shared: bool = False

    @property
    def name(self) -> tuple[str, str]:
        return (self.domain, self.key)

    def __str__(self) -> str:
        return f"{self.domain}:{self.key} ({'shared' if self.shared else 'exclusive'})"
