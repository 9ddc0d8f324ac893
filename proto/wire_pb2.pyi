from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FrameKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_KIND_UNKNOWN: _ClassVar[FrameKind]
    FRAME_KIND_CREATE_PRODUCER: _ClassVar[FrameKind]
    FRAME_KIND_PRODUCE_REQUEST: _ClassVar[FrameKind]
    FRAME_KIND_PRODUCE_RESPONSE: _ClassVar[FrameKind]
    FRAME_KIND_ERROR: _ClassVar[FrameKind]
    FRAME_KIND_REPLICA_ACK: _ClassVar[FrameKind]
    FRAME_KIND_LOG_ENTRY: _ClassVar[FrameKind]
FRAME_KIND_UNKNOWN: FrameKind
FRAME_KIND_CREATE_PRODUCER: FrameKind
FRAME_KIND_PRODUCE_REQUEST: FrameKind
FRAME_KIND_PRODUCE_RESPONSE: FrameKind
FRAME_KIND_ERROR: FrameKind
FRAME_KIND_REPLICA_ACK: FrameKind
FRAME_KIND_LOG_ENTRY: FrameKind

class DescribeNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeNodeResponse(_message.Message):
    __slots__ = ("server_id", "produce_port", "internal_port", "replication_port")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_PORT_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_PORT_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_PORT_FIELD_NUMBER: _ClassVar[int]
    server_id: int
    produce_port: int
    internal_port: int
    replication_port: int
    def __init__(self, server_id: _Optional[int] = ..., produce_port: _Optional[int] = ..., internal_port: _Optional[int] = ..., replication_port: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("server_id", "wall_time_ms", "loop_stall_ms")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOOP_STALL_MS_FIELD_NUMBER: _ClassVar[int]
    server_id: int
    wall_time_ms: int
    loop_stall_ms: int
    def __init__(self, server_id: _Optional[int] = ..., wall_time_ms: _Optional[int] = ..., loop_stall_ms: _Optional[int] = ...) -> None: ...
