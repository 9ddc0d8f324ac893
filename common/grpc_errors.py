"""How StreamingErrors cross gRPC when there is no response message to carry them.

Header failures of a stream and errors of the unary manager calls end the call with a
gRPC status chosen by code, plus the serialized StreamingError in the trailing metadata
key `streaming-error-bin`, so seed-only clients get a meaningful status and streamwal
clients get the exact typed error back.
"""

from __future__ import annotations

import grpc

from streamwal.errors import Code, PermissionDenied, StreamingError, Unavailable
from streamwal.proto import streaming_pb2 as pb

ERROR_KEY = "streaming-error-bin"

_STATUS = {
    Code.STREAMING_CODE_CHANNEL_EXIST: grpc.StatusCode.ALREADY_EXISTS,
    Code.STREAMING_CODE_CHANNEL_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    Code.STREAMING_CODE_CHANNEL_FENCED: grpc.StatusCode.FAILED_PRECONDITION,
    Code.STREAMING_CODE_ON_SHUTDOWN: grpc.StatusCode.UNAVAILABLE,
    Code.STREAMING_CODE_INVALID_REQUEST_SEQ: grpc.StatusCode.INVALID_ARGUMENT,
    Code.STREAMING_CODE_UNMATCHED_CHANNEL_TERM: grpc.StatusCode.FAILED_PRECONDITION,
    Code.STREAMING_CODE_IGNORED_OPERATION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.STREAMING_CODE_INNER: grpc.StatusCode.INTERNAL,
    Code.STREAMING_CODE_EOF: grpc.StatusCode.OUT_OF_RANGE,
    Code.STREAMING_CODE_INVAILD_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.STREAMING_CODE_RESOURCE_ACQUIRED: grpc.StatusCode.ABORTED,
    Code.STREAMING_CODE_BROADCAST_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.STREAMING_CODE_UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.STREAMING_CODE_DATA_LOSS: grpc.StatusCode.DATA_LOSS,
    Code.STREAMING_CODE_RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.STREAMING_CODE_TRANSACTION_EXPIRED: grpc.StatusCode.ABORTED,
    Code.STREAMING_CODE_INVALID_TRANSACTION_STATE: grpc.StatusCode.FAILED_PRECONDITION,
    Code.STREAMING_CODE_CONSUMER_GROUP_EXIST: grpc.StatusCode.ALREADY_EXISTS,
    Code.STREAMING_CODE_CONSUMER_GROUP_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
}


def status_for(err: StreamingError) -> grpc.StatusCode:
    return _STATUS.get(err.code, grpc.StatusCode.UNKNOWN)


def trailing(err: StreamingError) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_KEY, err.to_proto().SerializeToString()),)


def from_trailing(metadata) -> StreamingError | None:
    """The StreamingError a node put in trailing metadata, if any."""
    for key, value in metadata or ():
        if key == ERROR_KEY:
            return StreamingError.from_proto(pb.StreamingError.FromString(value))
    return None


def from_rpc_error(exc: grpc.RpcError) -> StreamingError:
    """The typed error behind a failed call: the node's own, or one made from the status."""
    err = from_trailing(exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else ())
    if err is not None:
        return err
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return PermissionDenied(f"{code.name}: {details}")
    return Unavailable(f"{code.name if code else 'RPC'}: {details}")


async def abort(context, err: StreamingError) -> None:
    """End a server call (grpc.aio ServicerContext) with `err`'s status and trailing error."""
    await context.abort(status_for(err), str(err), trailing_metadata=trailing(err))
