from . import streaming_pb2 as _streaming_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateConsumerGroupRequest(_message.Message):
    __slots__ = ("pchannel", "group")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ...) -> None: ...

class CreateConsumerGroupResponse(_message.Message):
    __slots__ = ("cursor",)
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    def __init__(self, cursor: _Optional[int] = ...) -> None: ...

class DestroyConsumerGroupRequest(_message.Message):
    __slots__ = ("pchannel", "group")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ...) -> None: ...

class DestroyConsumerGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupConsumeRequest(_message.Message):
    __slots__ = ("pchannel", "group", "max_messages", "consumer_id", "claim", "at_least_once", "session_timeout_ms")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    AT_LEAST_ONCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    max_messages: int
    consumer_id: str
    claim: int
    at_least_once: bool
    session_timeout_ms: int
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ..., max_messages: _Optional[int] = ..., consumer_id: _Optional[str] = ..., claim: _Optional[int] = ..., at_least_once: _Optional[bool] = ..., session_timeout_ms: _Optional[int] = ...) -> None: ...

class GroupConsumeResponse(_message.Message):
    __slots__ = ("batches", "cursor", "redelivered")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.ConsumeBatchResponse]
    cursor: int
    redelivered: bool
    def __init__(self, batches: _Optional[_Iterable[_Union[_streaming_pb2.ConsumeBatchResponse, _Mapping]]] = ..., cursor: _Optional[int] = ..., redelivered: _Optional[bool] = ...) -> None: ...

class GroupCommitRequest(_message.Message):
    __slots__ = ("pchannel", "group", "consumer_id", "offset", "leave", "session_timeout_ms")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    consumer_id: str
    offset: int
    leave: bool
    session_timeout_ms: int
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., offset: _Optional[int] = ..., leave: _Optional[bool] = ..., session_timeout_ms: _Optional[int] = ...) -> None: ...

class GroupCommitResponse(_message.Message):
    __slots__ = ("committed",)
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    committed: int
    def __init__(self, committed: _Optional[int] = ...) -> None: ...

class DescribeConsumerGroupsRequest(_message.Message):
    __slots__ = ("pchannel", "groups")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., groups: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("consumer_id", "pending_ranges", "pending_offsets", "idle_seconds")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_RANGES_FIELD_NUMBER: _ClassVar[int]
    PENDING_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    pending_ranges: int
    pending_offsets: int
    idle_seconds: float
    def __init__(self, consumer_id: _Optional[str] = ..., pending_ranges: _Optional[int] = ..., pending_offsets: _Optional[int] = ..., idle_seconds: _Optional[float] = ...) -> None: ...

class ConsumerGroupDescription(_message.Message):
    __slots__ = ("group", "cursor", "committed", "end_offset", "lag", "members", "orphaned_ranges")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ORPHANED_RANGES_FIELD_NUMBER: _ClassVar[int]
    group: str
    cursor: int
    committed: int
    end_offset: int
    lag: int
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    orphaned_ranges: int
    def __init__(self, group: _Optional[str] = ..., cursor: _Optional[int] = ..., committed: _Optional[int] = ..., end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., orphaned_ranges: _Optional[int] = ...) -> None: ...

class DescribeConsumerGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupDescription]
    def __init__(self, groups: _Optional[_Iterable[_Union[ConsumerGroupDescription, _Mapping]]] = ...) -> None: ...

class GroupSeekRequest(_message.Message):
    __slots__ = ("pchannel", "group", "message_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    message_id: _streaming_pb2.MessageID
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ..., message_id: _Optional[_Union[_streaming_pb2.MessageID, _Mapping]] = ...) -> None: ...

class GroupSeekResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
