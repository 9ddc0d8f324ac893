from . import streaming_pb2 as _streaming_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BroadcastTaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BROADCAST_TASK_STATE_UNKNOWN: _ClassVar[BroadcastTaskState]
    BROADCAST_TASK_STATE_PENDING: _ClassVar[BroadcastTaskState]
    BROADCAST_TASK_STATE_DONE: _ClassVar[BroadcastTaskState]
    BROADCAST_TASK_STATE_TOMBSTONE: _ClassVar[BroadcastTaskState]

class WaitUntil(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_UNTIL_ACK_ONCE: _ClassVar[WaitUntil]
    WAIT_UNTIL_ACK_ALL: _ClassVar[WaitUntil]
BROADCAST_TASK_STATE_UNKNOWN: BroadcastTaskState
BROADCAST_TASK_STATE_PENDING: BroadcastTaskState
BROADCAST_TASK_STATE_DONE: BroadcastTaskState
BROADCAST_TASK_STATE_TOMBSTONE: BroadcastTaskState
WAIT_UNTIL_ACK_ONCE: WaitUntil
WAIT_UNTIL_ACK_ALL: WaitUntil

class ResourceKey(_message.Message):
    __slots__ = ("domain", "key", "shared")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    domain: str
    key: str
    shared: bool
    def __init__(self, domain: _Optional[str] = ..., key: _Optional[str] = ..., shared: _Optional[bool] = ...) -> None: ...

class VChannelProgress(_message.Message):
    __slots__ = ("vchannel", "pchannel", "appended", "message_id", "time_tick", "acked")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    pchannel: str
    appended: bool
    message_id: _streaming_pb2.MessageID
    time_tick: int
    acked: bool
    def __init__(self, vchannel: _Optional[str] = ..., pchannel: _Optional[str] = ..., appended: _Optional[bool] = ..., message_id: _Optional[_Union[_streaming_pb2.MessageID, _Mapping]] = ..., time_tick: _Optional[int] = ..., acked: _Optional[bool] = ...) -> None: ...

class BroadcastTask(_message.Message):
    __slots__ = ("broadcast_id", "request_id", "message", "resource_keys", "state", "vchannels", "created_at_ms", "tombstoned_at_ms")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_KEYS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    request_id: str
    message: _streaming_pb2.Message
    resource_keys: _containers.RepeatedCompositeFieldContainer[ResourceKey]
    state: BroadcastTaskState
    vchannels: _containers.RepeatedCompositeFieldContainer[VChannelProgress]
    created_at_ms: int
    tombstoned_at_ms: int
    def __init__(self, broadcast_id: _Optional[int] = ..., request_id: _Optional[str] = ..., message: _Optional[_Union[_streaming_pb2.Message, _Mapping]] = ..., resource_keys: _Optional[_Iterable[_Union[ResourceKey, _Mapping]]] = ..., state: _Optional[_Union[BroadcastTaskState, str]] = ..., vchannels: _Optional[_Iterable[_Union[VChannelProgress, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., tombstoned_at_ms: _Optional[int] = ...) -> None: ...

class ListBroadcastsRequest(_message.Message):
    __slots__ = ("include_tombstones",)
    INCLUDE_TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    include_tombstones: bool
    def __init__(self, include_tombstones: _Optional[bool] = ...) -> None: ...

class ListBroadcastsResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[BroadcastTask]
    def __init__(self, tasks: _Optional[_Iterable[_Union[BroadcastTask, _Mapping]]] = ...) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("message", "vchannels", "resource_keys", "request_id")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    message: _streaming_pb2.Message
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    resource_keys: _containers.RepeatedCompositeFieldContainer[ResourceKey]
    request_id: str
    def __init__(self, message: _Optional[_Union[_streaming_pb2.Message, _Mapping]] = ..., vchannels: _Optional[_Iterable[str]] = ..., resource_keys: _Optional[_Iterable[_Union[ResourceKey, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BroadcastResponse(_message.Message):
    __slots__ = ("broadcast_id", "results")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    results: _containers.RepeatedCompositeFieldContainer[VChannelProgress]
    def __init__(self, broadcast_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[VChannelProgress, _Mapping]]] = ...) -> None: ...

class BroadcastAckRequest(_message.Message):
    __slots__ = ("broadcast_id", "vchannel")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannel: str
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ...) -> None: ...

class BroadcastAckResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WaitResourceKeyRequest(_message.Message):
    __slots__ = ("key", "until")
    KEY_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    key: ResourceKey
    until: WaitUntil
    def __init__(self, key: _Optional[_Union[ResourceKey, _Mapping]] = ..., until: _Optional[_Union[WaitUntil, str]] = ...) -> None: ...

class WaitResourceKeyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
