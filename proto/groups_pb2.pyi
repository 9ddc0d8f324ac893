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
    __slots__ = ("pchannel", "group", "max_messages", "consumer_id", "claim")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    pchannel: _streaming_pb2.PChannelInfo
    group: str
    max_messages: int
    consumer_id: str
    claim: int
    def __init__(self, pchannel: _Optional[_Union[_streaming_pb2.PChannelInfo, _Mapping]] = ..., group: _Optional[str] = ..., max_messages: _Optional[int] = ..., consumer_id: _Optional[str] = ..., claim: _Optional[int] = ...) -> None: ...

class GroupConsumeResponse(_message.Message):
    __slots__ = ("batches", "cursor")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.ConsumeBatchResponse]
    cursor: int
    def __init__(self, batches: _Optional[_Iterable[_Union[_streaming_pb2.ConsumeBatchResponse, _Mapping]]] = ..., cursor: _Optional[int] = ...) -> None: ...

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
