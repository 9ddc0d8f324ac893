from . import streaming_pb2 as _streaming_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OwnerDescription(_message.Message):
    __slots__ = ("role", "address", "description_text")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_TEXT_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    description_text: str
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ..., description_text: _Optional[str] = ...) -> None: ...

class ChannelRecord(_message.Message):
    __slots__ = ("meta", "owner", "destroyed", "created_at_ms", "replicas", "members", "previous_members", "joint_until", "allow_data_loss", "retention", "applied_retention", "node_selector", "anti_affinity", "unled_term")
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    META_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DESTROYED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    JOINT_UNTIL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_RETENTION_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    UNLED_TERM_FIELD_NUMBER: _ClassVar[int]
    meta: _streaming_pb2.PChannelMeta
    owner: OwnerDescription
    destroyed: bool
    created_at_ms: int
    replicas: int
    members: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.StreamingNodeInfo]
    previous_members: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.StreamingNodeInfo]
    joint_until: int
    allow_data_loss: bool
    retention: _streaming_pb2.RetentionPolicy
    applied_retention: _streaming_pb2.RetentionPolicy
    node_selector: _containers.ScalarMap[str, str]
    anti_affinity: str
    unled_term: int
    def __init__(self, meta: _Optional[_Union[_streaming_pb2.PChannelMeta, _Mapping]] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., destroyed: _Optional[bool] = ..., created_at_ms: _Optional[int] = ..., replicas: _Optional[int] = ..., members: _Optional[_Iterable[_Union[_streaming_pb2.StreamingNodeInfo, _Mapping]]] = ..., previous_members: _Optional[_Iterable[_Union[_streaming_pb2.StreamingNodeInfo, _Mapping]]] = ..., joint_until: _Optional[int] = ..., allow_data_loss: _Optional[bool] = ..., retention: _Optional[_Union[_streaming_pb2.RetentionPolicy, _Mapping]] = ..., applied_retention: _Optional[_Union[_streaming_pb2.RetentionPolicy, _Mapping]] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., anti_affinity: _Optional[str] = ..., unled_term: _Optional[int] = ...) -> None: ...

class ChannelManifest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterRecord(_message.Message):
    __slots__ = ("incarnation", "drained_nodes")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DRAINED_NODES_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    drained_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, incarnation: _Optional[int] = ..., drained_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateChannelsRequest(_message.Message):
    __slots__ = ("owner", "num_channels", "prefix", "replicas", "allow_data_loss", "names", "retention")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NUM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    owner: OwnerDescription
    num_channels: int
    prefix: str
    replicas: int
    allow_data_loss: bool
    names: _containers.RepeatedScalarFieldContainer[str]
    retention: _streaming_pb2.RetentionPolicy
    def __init__(self, owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., num_channels: _Optional[int] = ..., prefix: _Optional[str] = ..., replicas: _Optional[int] = ..., allow_data_loss: _Optional[bool] = ..., names: _Optional[_Iterable[str]] = ..., retention: _Optional[_Union[_streaming_pb2.RetentionPolicy, _Mapping]] = ...) -> None: ...

class CreateChannelsResponse(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyChannelsRequest(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyChannelsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeChannelsRequest(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ChannelDescription(_message.Message):
    __slots__ = ("channel_name", "owner", "meta", "replicas", "members", "progress", "next_offset", "commit_offset", "data_loss", "allow_data_loss", "first_offset", "size_bytes", "retention", "waiting")
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_DATA_LOSS_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    channel_name: str
    owner: OwnerDescription
    meta: _streaming_pb2.PChannelMeta
    replicas: int
    members: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.StreamingNodeInfo]
    progress: _containers.RepeatedCompositeFieldContainer[_streaming_pb2.ReplicaProgress]
    next_offset: int
    commit_offset: int
    data_loss: str
    allow_data_loss: bool
    first_offset: int
    size_bytes: int
    retention: _streaming_pb2.RetentionPolicy
    waiting: str
    def __init__(self, channel_name: _Optional[str] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., meta: _Optional[_Union[_streaming_pb2.PChannelMeta, _Mapping]] = ..., replicas: _Optional[int] = ..., members: _Optional[_Iterable[_Union[_streaming_pb2.StreamingNodeInfo, _Mapping]]] = ..., progress: _Optional[_Iterable[_Union[_streaming_pb2.ReplicaProgress, _Mapping]]] = ..., next_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., data_loss: _Optional[str] = ..., allow_data_loss: _Optional[bool] = ..., first_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., retention: _Optional[_Union[_streaming_pb2.RetentionPolicy, _Mapping]] = ..., waiting: _Optional[str] = ...) -> None: ...

class DescribeChannelsResponse(_message.Message):
    __slots__ = ("descriptions",)
    DESCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    descriptions: _containers.RepeatedCompositeFieldContainer[ChannelDescription]
    def __init__(self, descriptions: _Optional[_Iterable[_Union[ChannelDescription, _Mapping]]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("server_id", "undrain")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    server_id: int
    undrain: bool
    def __init__(self, server_id: _Optional[int] = ..., undrain: _Optional[bool] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcceptDataLossRequest(_message.Message):
    __slots__ = ("channel_name",)
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    channel_name: str
    def __init__(self, channel_name: _Optional[str] = ...) -> None: ...

class AcceptDataLossResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeDescription(_message.Message):
    __slots__ = ("node", "liveness", "drained", "channels")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    node: _streaming_pb2.StreamingNodeInfo
    liveness: str
    drained: bool
    channels: int
    def __init__(self, node: _Optional[_Union[_streaming_pb2.StreamingNodeInfo, _Mapping]] = ..., liveness: _Optional[str] = ..., drained: _Optional[bool] = ..., channels: _Optional[int] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeDescription]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeDescription, _Mapping]]] = ...) -> None: ...
