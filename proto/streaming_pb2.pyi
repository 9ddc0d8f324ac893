from . import milvus_pb2 as _milvus_pb2
from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PChannelMetaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCHANNEL_META_STATE_UNKNOWN: _ClassVar[PChannelMetaState]
    PCHANNEL_META_STATE_UNINITIALIZED: _ClassVar[PChannelMetaState]
    PCHANNEL_META_STATE_ASSIGNING: _ClassVar[PChannelMetaState]
    PCHANNEL_META_STATE_ASSIGNED: _ClassVar[PChannelMetaState]
    PCHANNEL_META_STATE_UNAVAILABLE: _ClassVar[PChannelMetaState]

class StreamingCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAMING_CODE_OK: _ClassVar[StreamingCode]
    STREAMING_CODE_CHANNEL_EXIST: _ClassVar[StreamingCode]
    STREAMING_CODE_CHANNEL_NOT_EXIST: _ClassVar[StreamingCode]
    STREAMING_CODE_CHANNEL_FENCED: _ClassVar[StreamingCode]
    STREAMING_CODE_ON_SHUTDOWN: _ClassVar[StreamingCode]
    STREAMING_CODE_INVALID_REQUEST_SEQ: _ClassVar[StreamingCode]
    STREAMING_CODE_UNMATCHED_CHANNEL_TERM: _ClassVar[StreamingCode]
    STREAMING_CODE_IGNORED_OPERATION: _ClassVar[StreamingCode]
    STREAMING_CODE_INNER: _ClassVar[StreamingCode]
    STREAMING_CODE_EOF: _ClassVar[StreamingCode]
    STREAMING_CODE_INVAILD_ARGUMENT: _ClassVar[StreamingCode]
    STREAMING_CODE_RESOURCE_ACQUIRED: _ClassVar[StreamingCode]
    STREAMING_CODE_BROADCAST_NOT_FOUND: _ClassVar[StreamingCode]
    STREAMING_CODE_UNSUPPORTED: _ClassVar[StreamingCode]
    STREAMING_CODE_DATA_LOSS: _ClassVar[StreamingCode]
    STREAMING_CODE_RESOURCE_EXHAUSTED: _ClassVar[StreamingCode]
    STREAMING_CODE_TRANSACTION_EXPIRED: _ClassVar[StreamingCode]
    STREAMING_CODE_INVALID_TRANSACTION_STATE: _ClassVar[StreamingCode]
    STREAMING_CODE_CONSUMER_GROUP_EXIST: _ClassVar[StreamingCode]
    STREAMING_CODE_CONSUMER_GROUP_NOT_EXIST: _ClassVar[StreamingCode]
    STREAMING_CODE_UNKNOWN: _ClassVar[StreamingCode]

class ReplicaRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_ROLE_LEADER: _ClassVar[ReplicaRole]
    REPLICA_ROLE_FOLLOWER: _ClassVar[ReplicaRole]

class AckLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_LEVEL_DEFAULT: _ClassVar[AckLevel]
    ACK_LEVEL_LEADER: _ClassVar[AckLevel]
    ACK_LEVEL_QUORUM: _ClassVar[AckLevel]
PCHANNEL_META_STATE_UNKNOWN: PChannelMetaState
PCHANNEL_META_STATE_UNINITIALIZED: PChannelMetaState
PCHANNEL_META_STATE_ASSIGNING: PChannelMetaState
PCHANNEL_META_STATE_ASSIGNED: PChannelMetaState
PCHANNEL_META_STATE_UNAVAILABLE: PChannelMetaState
STREAMING_CODE_OK: StreamingCode
STREAMING_CODE_CHANNEL_EXIST: StreamingCode
STREAMING_CODE_CHANNEL_NOT_EXIST: StreamingCode
STREAMING_CODE_CHANNEL_FENCED: StreamingCode
STREAMING_CODE_ON_SHUTDOWN: StreamingCode
STREAMING_CODE_INVALID_REQUEST_SEQ: StreamingCode
STREAMING_CODE_UNMATCHED_CHANNEL_TERM: StreamingCode
STREAMING_CODE_IGNORED_OPERATION: StreamingCode
STREAMING_CODE_INNER: StreamingCode
STREAMING_CODE_EOF: StreamingCode
STREAMING_CODE_INVAILD_ARGUMENT: StreamingCode
STREAMING_CODE_RESOURCE_ACQUIRED: StreamingCode
STREAMING_CODE_BROADCAST_NOT_FOUND: StreamingCode
STREAMING_CODE_UNSUPPORTED: StreamingCode
STREAMING_CODE_DATA_LOSS: StreamingCode
STREAMING_CODE_RESOURCE_EXHAUSTED: StreamingCode
STREAMING_CODE_TRANSACTION_EXPIRED: StreamingCode
STREAMING_CODE_INVALID_TRANSACTION_STATE: StreamingCode
STREAMING_CODE_CONSUMER_GROUP_EXIST: StreamingCode
STREAMING_CODE_CONSUMER_GROUP_NOT_EXIST: StreamingCode
STREAMING_CODE_UNKNOWN: StreamingCode
REPLICA_ROLE_LEADER: ReplicaRole
REPLICA_ROLE_FOLLOWER: ReplicaRole
ACK_LEVEL_DEFAULT: AckLevel
ACK_LEVEL_LEADER: AckLevel
ACK_LEVEL_QUORUM: AckLevel

class MessageID(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    def __init__(self, id: _Optional[bytes] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("payload", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PChannelInfo(_message.Message):
    __slots__ = ("name", "term")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    name: str
    term: int
    def __init__(self, name: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class PChannelMetaHistory(_message.Message):
    __slots__ = ("term", "node")
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    term: int
    node: StreamingNodeInfo
    def __init__(self, term: _Optional[int] = ..., node: _Optional[_Union[StreamingNodeInfo, _Mapping]] = ...) -> None: ...

class PChannelMeta(_message.Message):
    __slots__ = ("channel", "node", "state", "histories")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HISTORIES_FIELD_NUMBER: _ClassVar[int]
    channel: PChannelInfo
    node: StreamingNodeInfo
    state: PChannelMetaState
    histories: _containers.RepeatedCompositeFieldContainer[PChannelMetaHistory]
    def __init__(self, channel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., node: _Optional[_Union[StreamingNodeInfo, _Mapping]] = ..., state: _Optional[_Union[PChannelMetaState, str]] = ..., histories: _Optional[_Iterable[_Union[PChannelMetaHistory, _Mapping]]] = ...) -> None: ...

class VersionPair(_message.Message):
    __slots__ = ("local",)
    GLOBAL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    local: int
    def __init__(self, local: _Optional[int] = ..., **kwargs) -> None: ...

class AssignmentDiscoverRequest(_message.Message):
    __slots__ = ("report_error", "close")
    REPORT_ERROR_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    report_error: ReportAssignmentErrorRequest
    close: CloseAssignmentDiscoverRequest
    def __init__(self, report_error: _Optional[_Union[ReportAssignmentErrorRequest, _Mapping]] = ..., close: _Optional[_Union[CloseAssignmentDiscoverRequest, _Mapping]] = ...) -> None: ...

class ReportAssignmentErrorRequest(_message.Message):
    __slots__ = ("pchannel", "err")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    ERR_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    err: StreamingError
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., err: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class CloseAssignmentDiscoverRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AssignmentDiscoverResponse(_message.Message):
    __slots__ = ("full_assignment", "close", "delta")
    FULL_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    full_assignment: FullStreamingNodeAssignmentWithVersion
    close: CloseAssignmentDiscoverResponse
    delta: AssignmentDelta
    def __init__(self, full_assignment: _Optional[_Union[FullStreamingNodeAssignmentWithVersion, _Mapping]] = ..., close: _Optional[_Union[CloseAssignmentDiscoverResponse, _Mapping]] = ..., delta: _Optional[_Union[AssignmentDelta, _Mapping]] = ...) -> None: ...

class AssignmentDelta(_message.Message):
    __slots__ = ("base", "version", "assigned", "unassigned")
    BASE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    UNASSIGNED_FIELD_NUMBER: _ClassVar[int]
    base: VersionPair
    version: VersionPair
    assigned: _containers.RepeatedCompositeFieldContainer[StreamingNodeAssignment]
    unassigned: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, base: _Optional[_Union[VersionPair, _Mapping]] = ..., version: _Optional[_Union[VersionPair, _Mapping]] = ..., assigned: _Optional[_Iterable[_Union[StreamingNodeAssignment, _Mapping]]] = ..., unassigned: _Optional[_Iterable[str]] = ...) -> None: ...

class FullStreamingNodeAssignmentWithVersion(_message.Message):
    __slots__ = ("version", "assignments")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    version: VersionPair
    assignments: _containers.RepeatedCompositeFieldContainer[StreamingNodeAssignment]
    def __init__(self, version: _Optional[_Union[VersionPair, _Mapping]] = ..., assignments: _Optional[_Iterable[_Union[StreamingNodeAssignment, _Mapping]]] = ...) -> None: ...

class CloseAssignmentDiscoverResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeInfo(_message.Message):
    __slots__ = ("server_id", "address")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    server_id: int
    address: str
    def __init__(self, server_id: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class StreamingNodeAssignment(_message.Message):
    __slots__ = ("node", "channels")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    node: StreamingNodeInfo
    channels: _containers.RepeatedCompositeFieldContainer[PChannelInfo]
    def __init__(self, node: _Optional[_Union[StreamingNodeInfo, _Mapping]] = ..., channels: _Optional[_Iterable[_Union[PChannelInfo, _Mapping]]] = ...) -> None: ...

class DeliverPolicy(_message.Message):
    __slots__ = ("all", "latest", "start_from", "start_after")
    ALL_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    START_FROM_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    all: _empty_pb2.Empty
    latest: _empty_pb2.Empty
    start_from: MessageID
    start_after: MessageID
    def __init__(self, all: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., latest: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., start_from: _Optional[_Union[MessageID, _Mapping]] = ..., start_after: _Optional[_Union[MessageID, _Mapping]] = ...) -> None: ...

class DeliverFilter(_message.Message):
    __slots__ = ("time_tick_gt", "time_tick_gte", "vchannel")
    TIME_TICK_GT_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_GTE_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    time_tick_gt: DeliverFilterTimeTickGT
    time_tick_gte: DeliverFilterTimeTickGTE
    vchannel: DeliverFilterVChannel
    def __init__(self, time_tick_gt: _Optional[_Union[DeliverFilterTimeTickGT, _Mapping]] = ..., time_tick_gte: _Optional[_Union[DeliverFilterTimeTickGTE, _Mapping]] = ..., vchannel: _Optional[_Union[DeliverFilterVChannel, _Mapping]] = ...) -> None: ...

class DeliverFilterTimeTickGT(_message.Message):
    __slots__ = ("time_tick",)
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    time_tick: int
    def __init__(self, time_tick: _Optional[int] = ...) -> None: ...

class DeliverFilterTimeTickGTE(_message.Message):
    __slots__ = ("time_tick",)
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    time_tick: int
    def __init__(self, time_tick: _Optional[int] = ...) -> None: ...

class DeliverFilterVChannel(_message.Message):
    __slots__ = ("vchannel",)
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    def __init__(self, vchannel: _Optional[str] = ...) -> None: ...

class StreamingError(_message.Message):
    __slots__ = ("code", "cause")
    CODE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    code: StreamingCode
    cause: str
    def __init__(self, code: _Optional[_Union[StreamingCode, str]] = ..., cause: _Optional[str] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("produce", "close", "produce_batch", "txn", "ping")
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_BATCH_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    produce: ProduceMessageRequest
    close: CloseProducerRequest
    produce_batch: ProduceBatchRequest
    txn: TxnRequest
    ping: ProducePing
    def __init__(self, produce: _Optional[_Union[ProduceMessageRequest, _Mapping]] = ..., close: _Optional[_Union[CloseProducerRequest, _Mapping]] = ..., produce_batch: _Optional[_Union[ProduceBatchRequest, _Mapping]] = ..., txn: _Optional[_Union[TxnRequest, _Mapping]] = ..., ping: _Optional[_Union[ProducePing, _Mapping]] = ...) -> None: ...

class CreateProducerRequest(_message.Message):
    __slots__ = ("pchannel", "producer_id", "ack_level")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_LEVEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    producer_id: str
    ack_level: AckLevel
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., producer_id: _Optional[str] = ..., ack_level: _Optional[_Union[AckLevel, str]] = ...) -> None: ...

class ProduceMessageRequest(_message.Message):
    __slots__ = ("request_id", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    message: Message
    def __init__(self, request_id: _Optional[int] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class CloseProducerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("create", "produce", "close", "produce_batch", "txn", "pong")
    CREATE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_BATCH_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    create: CreateProducerResponse
    produce: ProduceMessageResponse
    close: CloseProducerResponse
    produce_batch: ProduceBatchResponse
    txn: TxnResponse
    pong: ProducePong
    def __init__(self, create: _Optional[_Union[CreateProducerResponse, _Mapping]] = ..., produce: _Optional[_Union[ProduceMessageResponse, _Mapping]] = ..., close: _Optional[_Union[CloseProducerResponse, _Mapping]] = ..., produce_batch: _Optional[_Union[ProduceBatchResponse, _Mapping]] = ..., txn: _Optional[_Union[TxnResponse, _Mapping]] = ..., pong: _Optional[_Union[ProducePong, _Mapping]] = ...) -> None: ...

class CreateProducerResponse(_message.Message):
    __slots__ = ("producer_id", "last_sequence", "answers_ping")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_PING_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    last_sequence: int
    answers_ping: bool
    def __init__(self, producer_id: _Optional[int] = ..., last_sequence: _Optional[int] = ..., answers_ping: _Optional[bool] = ...) -> None: ...

class ProducePing(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProducePong(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProduceMessageResponse(_message.Message):
    __slots__ = ("request_id", "result", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    result: ProduceMessageResponseResult
    error: StreamingError
    def __init__(self, request_id: _Optional[int] = ..., result: _Optional[_Union[ProduceMessageResponseResult, _Mapping]] = ..., error: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class ProduceMessageResponseResult(_message.Message):
    __slots__ = ("id", "time_tick")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    id: MessageID
    time_tick: int
    def __init__(self, id: _Optional[_Union[MessageID, _Mapping]] = ..., time_tick: _Optional[int] = ...) -> None: ...

class CloseProducerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("close",)
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    close: CloseConsumerRequest
    def __init__(self, close: _Optional[_Union[CloseConsumerRequest, _Mapping]] = ...) -> None: ...

class CloseConsumerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateConsumerRequest(_message.Message):
    __slots__ = ("pchannel", "deliver_policy", "deliver_filters", "options")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    DELIVER_POLICY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_FILTERS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    deliver_policy: DeliverPolicy
    deliver_filters: _containers.RepeatedCompositeFieldContainer[DeliverFilter]
    options: ConsumerOptions
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., deliver_policy: _Optional[_Union[DeliverPolicy, _Mapping]] = ..., deliver_filters: _Optional[_Iterable[_Union[DeliverFilter, _Mapping]]] = ..., options: _Optional[_Union[ConsumerOptions, _Mapping]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("create", "consume", "close", "consume_batch")
    CREATE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_BATCH_FIELD_NUMBER: _ClassVar[int]
    create: CreateConsumerResponse
    consume: ConsumeMessageReponse
    close: CloseConsumerResponse
    consume_batch: ConsumeBatchResponse
    def __init__(self, create: _Optional[_Union[CreateConsumerResponse, _Mapping]] = ..., consume: _Optional[_Union[ConsumeMessageReponse, _Mapping]] = ..., close: _Optional[_Union[CloseConsumerResponse, _Mapping]] = ..., consume_batch: _Optional[_Union[ConsumeBatchResponse, _Mapping]] = ...) -> None: ...

class CreateConsumerResponse(_message.Message):
    __slots__ = ("first_offset", "next_offset")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    next_offset: int
    def __init__(self, first_offset: _Optional[int] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ConsumeMessageReponse(_message.Message):
    __slots__ = ("id", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: MessageID
    message: Message
    def __init__(self, id: _Optional[_Union[MessageID, _Mapping]] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class CloseConsumerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeManagerAssignRequest(_message.Message):
    __slots__ = ("pchannel", "retention", "catch_up_from", "min_next_offset", "replica_set", "accept_data_loss")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FROM_FIELD_NUMBER: _ClassVar[int]
    MIN_NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICA_SET_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    retention: RetentionPolicy
    catch_up_from: str
    min_next_offset: int
    replica_set: ReplicaSet
    accept_data_loss: bool
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., retention: _Optional[_Union[RetentionPolicy, _Mapping]] = ..., catch_up_from: _Optional[str] = ..., min_next_offset: _Optional[int] = ..., replica_set: _Optional[_Union[ReplicaSet, _Mapping]] = ..., accept_data_loss: _Optional[bool] = ...) -> None: ...

class StreamingNodeManagerAssignResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeManagerRemoveRequest(_message.Message):
    __slots__ = ("pchannel",)
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ...) -> None: ...

class StreamingNodeManagerRemoveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeManagerCollectStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeBalanceAttributes(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingNodeManagerCollectStatusResponse(_message.Message):
    __slots__ = ("balance_attributes", "server_id", "channels", "wall_time_ms", "probe_port")
    BALANCE_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    balance_attributes: StreamingNodeBalanceAttributes
    server_id: int
    channels: _containers.RepeatedCompositeFieldContainer[PChannelStatus]
    wall_time_ms: int
    probe_port: int
    def __init__(self, balance_attributes: _Optional[_Union[StreamingNodeBalanceAttributes, _Mapping]] = ..., server_id: _Optional[int] = ..., channels: _Optional[_Iterable[_Union[PChannelStatus, _Mapping]]] = ..., wall_time_ms: _Optional[int] = ..., probe_port: _Optional[int] = ...) -> None: ...

class FenceBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[FenceRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[FenceRequest, _Mapping]]] = ...) -> None: ...

class FenceBatchResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[FenceBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[FenceBatchItem, _Mapping]]] = ...) -> None: ...

class FenceBatchItem(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: FenceResponse
    error: StreamingError
    def __init__(self, response: _Optional[_Union[FenceResponse, _Mapping]] = ..., error: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class AssignBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StreamingNodeManagerAssignRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[StreamingNodeManagerAssignRequest, _Mapping]]] = ...) -> None: ...

class RemoveBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StreamingNodeManagerRemoveRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[StreamingNodeManagerRemoveRequest, _Mapping]]] = ...) -> None: ...

class BatchResults(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, items: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: StreamingError
    def __init__(self, error: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("pchannel", "from_offset", "end_offset")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    from_offset: int
    end_offset: int
    def __init__(self, pchannel: _Optional[str] = ..., from_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("base_offset", "record", "log_end", "term_history")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    TERM_HISTORY_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    record: bytes
    log_end: int
    term_history: _containers.RepeatedCompositeFieldContainer[TermStart]
    def __init__(self, base_offset: _Optional[int] = ..., record: _Optional[bytes] = ..., log_end: _Optional[int] = ..., term_history: _Optional[_Iterable[_Union[TermStart, _Mapping]]] = ...) -> None: ...

class TermStart(_message.Message):
    __slots__ = ("term", "first_offset")
    TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    term: int
    first_offset: int
    def __init__(self, term: _Optional[int] = ..., first_offset: _Optional[int] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class ProduceBatchRequest(_message.Message):
    __slots__ = ("request_id", "messages", "sequence", "barrier_time_tick")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BARRIER_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    messages: bytes
    sequence: int
    barrier_time_tick: int
    def __init__(self, request_id: _Optional[int] = ..., messages: _Optional[bytes] = ..., sequence: _Optional[int] = ..., barrier_time_tick: _Optional[int] = ...) -> None: ...

class ProduceBatchResponse(_message.Message):
    __slots__ = ("request_id", "result", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    result: ProduceBatchResult
    error: StreamingError
    def __init__(self, request_id: _Optional[int] = ..., result: _Optional[_Union[ProduceBatchResult, _Mapping]] = ..., error: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class ProduceBatchResult(_message.Message):
    __slots__ = ("first_id", "count", "first_time_tick", "duplicate")
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    first_id: MessageID
    count: int
    first_time_tick: int
    duplicate: bool
    def __init__(self, first_id: _Optional[_Union[MessageID, _Mapping]] = ..., count: _Optional[int] = ..., first_time_tick: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class ConsumerOptions(_message.Message):
    __slots__ = ("batched", "skip_time_ticks", "end_offset")
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    SKIP_TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    batched: bool
    skip_time_ticks: bool
    end_offset: int
    def __init__(self, batched: _Optional[bool] = ..., skip_time_ticks: _Optional[bool] = ..., end_offset: _Optional[int] = ...) -> None: ...

class ConsumeBatchResponse(_message.Message):
    __slots__ = ("first_id", "term", "first_time_tick", "messages", "offsets", "time_ticks", "tick_run_counts", "tick_run_first_ticks")
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    TICK_RUN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    TICK_RUN_FIRST_TICKS_FIELD_NUMBER: _ClassVar[int]
    first_id: MessageID
    term: int
    first_time_tick: int
    messages: bytes
    offsets: _containers.RepeatedScalarFieldContainer[int]
    time_ticks: _containers.RepeatedScalarFieldContainer[int]
    tick_run_counts: _containers.RepeatedScalarFieldContainer[int]
    tick_run_first_ticks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, first_id: _Optional[_Union[MessageID, _Mapping]] = ..., term: _Optional[int] = ..., first_time_tick: _Optional[int] = ..., messages: _Optional[bytes] = ..., offsets: _Optional[_Iterable[int]] = ..., time_ticks: _Optional[_Iterable[int]] = ..., tick_run_counts: _Optional[_Iterable[int]] = ..., tick_run_first_ticks: _Optional[_Iterable[int]] = ...) -> None: ...

class RetentionPolicy(_message.Message):
    __slots__ = ("max_age_ms", "max_bytes")
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_age_ms: int
    max_bytes: int
    def __init__(self, max_age_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class PChannelStatus(_message.Message):
    __slots__ = ("pchannel", "first_offset", "next_offset", "last_time_tick", "size_bytes", "producers", "consumers", "role", "last_term", "commit_offset", "replicas", "data_loss", "unhealthy", "retention")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    first_offset: int
    next_offset: int
    last_time_tick: int
    size_bytes: int
    producers: int
    consumers: int
    role: ReplicaRole
    last_term: int
    commit_offset: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaProgress]
    data_loss: str
    unhealthy: str
    retention: RetentionPolicy
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ..., first_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., last_time_tick: _Optional[int] = ..., size_bytes: _Optional[int] = ..., producers: _Optional[int] = ..., consumers: _Optional[int] = ..., role: _Optional[_Union[ReplicaRole, str]] = ..., last_term: _Optional[int] = ..., commit_offset: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaProgress, _Mapping]]] = ..., data_loss: _Optional[str] = ..., unhealthy: _Optional[str] = ..., retention: _Optional[_Union[RetentionPolicy, _Mapping]] = ...) -> None: ...

class ReplicaSet(_message.Message):
    __slots__ = ("role", "members", "leader")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    role: ReplicaRole
    members: _containers.RepeatedCompositeFieldContainer[StreamingNodeInfo]
    leader: StreamingNodeInfo
    def __init__(self, role: _Optional[_Union[ReplicaRole, str]] = ..., members: _Optional[_Iterable[_Union[StreamingNodeInfo, _Mapping]]] = ..., leader: _Optional[_Union[StreamingNodeInfo, _Mapping]] = ...) -> None: ...

class ReplicaProgress(_message.Message):
    __slots__ = ("node_id", "acked_offset", "lag")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    acked_offset: int
    lag: int
    def __init__(self, node_id: _Optional[int] = ..., acked_offset: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "replica", "acked_offset", "replay", "term_history", "batched")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    TERM_HISTORY_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: int
    replica: int
    acked_offset: int
    replay: bool
    term_history: _containers.RepeatedCompositeFieldContainer[TermStart]
    batched: bool
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[int] = ..., replica: _Optional[int] = ..., acked_offset: _Optional[int] = ..., replay: _Optional[bool] = ..., term_history: _Optional[_Iterable[_Union[TermStart, _Mapping]]] = ..., batched: _Optional[bool] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("offset", "record", "term", "commit_offset", "truncate_from", "term_history", "next_records")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FROM_FIELD_NUMBER: _ClassVar[int]
    TERM_HISTORY_FIELD_NUMBER: _ClassVar[int]
    NEXT_RECORDS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    record: bytes
    term: int
    commit_offset: int
    truncate_from: int
    term_history: _containers.RepeatedCompositeFieldContainer[TermStart]
    next_records: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, offset: _Optional[int] = ..., record: _Optional[bytes] = ..., term: _Optional[int] = ..., commit_offset: _Optional[int] = ..., truncate_from: _Optional[int] = ..., term_history: _Optional[_Iterable[_Union[TermStart, _Mapping]]] = ..., next_records: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("pchannel",)
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: PChannelInfo
    def __init__(self, pchannel: _Optional[_Union[PChannelInfo, _Mapping]] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("last_term", "next_offset", "commit_offset", "data_loss")
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    last_term: int
    next_offset: int
    commit_offset: int
    data_loss: str
    def __init__(self, last_term: _Optional[int] = ..., next_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., data_loss: _Optional[str] = ...) -> None: ...

class TxnRequest(_message.Message):
    __slots__ = ("request_id", "begin", "append", "commit", "rollback")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    begin: TxnBegin
    append: TxnAppend
    commit: TxnCommit
    rollback: TxnRollback
    def __init__(self, request_id: _Optional[int] = ..., begin: _Optional[_Union[TxnBegin, _Mapping]] = ..., append: _Optional[_Union[TxnAppend, _Mapping]] = ..., commit: _Optional[_Union[TxnCommit, _Mapping]] = ..., rollback: _Optional[_Union[TxnRollback, _Mapping]] = ...) -> None: ...

class TxnBegin(_message.Message):
    __slots__ = ("vchannel", "keepalive_ms")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    keepalive_ms: int
    def __init__(self, vchannel: _Optional[str] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class TxnAppend(_message.Message):
    __slots__ = ("txn_id", "messages")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    messages: bytes
    def __init__(self, txn_id: _Optional[int] = ..., messages: _Optional[bytes] = ...) -> None: ...

class TxnCommit(_message.Message):
    __slots__ = ("txn_id", "sequence", "barrier_time_tick")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BARRIER_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    sequence: int
    barrier_time_tick: int
    def __init__(self, txn_id: _Optional[int] = ..., sequence: _Optional[int] = ..., barrier_time_tick: _Optional[int] = ...) -> None: ...

class TxnRollback(_message.Message):
    __slots__ = ("txn_id",)
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    def __init__(self, txn_id: _Optional[int] = ...) -> None: ...

class TxnResponse(_message.Message):
    __slots__ = ("request_id", "begun", "appended", "committed", "rolled_back", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BEGUN_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    begun: TxnBegun
    appended: TxnAppended
    committed: TxnCommitted
    rolled_back: TxnRolledBack
    error: StreamingError
    def __init__(self, request_id: _Optional[int] = ..., begun: _Optional[_Union[TxnBegun, _Mapping]] = ..., appended: _Optional[_Union[TxnAppended, _Mapping]] = ..., committed: _Optional[_Union[TxnCommitted, _Mapping]] = ..., rolled_back: _Optional[_Union[TxnRolledBack, _Mapping]] = ..., error: _Optional[_Union[StreamingError, _Mapping]] = ...) -> None: ...

class TxnBegun(_message.Message):
    __slots__ = ("txn_id", "keepalive_ms")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    keepalive_ms: int
    def __init__(self, txn_id: _Optional[int] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class TxnAppended(_message.Message):
    __slots__ = ("count", "bytes")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    count: int
    bytes: int
    def __init__(self, count: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class TxnCommitted(_message.Message):
    __slots__ = ("first_id", "count", "time_tick", "duplicate")
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    first_id: MessageID
    count: int
    time_tick: int
    duplicate: bool
    def __init__(self, first_id: _Optional[_Union[MessageID, _Mapping]] = ..., count: _Optional[int] = ..., time_tick: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class TxnRolledBack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
