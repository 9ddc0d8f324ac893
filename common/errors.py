"""Typed errors that carry the wire protocol's StreamingCode.

Every part raises `StreamingError` (or a subclass picked by code) so that callers can
branch on `err.code` without parsing messages, and the node can turn any of them back
into the protocol's StreamingError message without losing the cause.
"""

from __future__ import annotations

from streamwal.proto import streaming_pb2 as pb

Code = pb.StreamingCode


class StreamingError(Exception):
    """An error with a StreamingCode; `str(err)` is the cause a user should read."""

    code: int = Code.STREAMING_CODE_UNKNOWN

    def __init__(self, cause: str, code: int | None = None) -> None:
        super().__init__(cause)
        if code is not None:
            self.code = code
        self.cause = cause

    @property
    def code_name(self) -> str:
        return Code.Name(self.code) if self.code in Code.values() else str(self.code)

    def __str__(self) -> str:
        return f"{self.code_name}: {self.cause}"

    def to_proto(self) -> pb.StreamingError:
        return pb.StreamingError(code=self.code, cause=self.cause)

    @staticmethod
    def from_proto(err: pb.StreamingError) -> StreamingError:
        return error_for(err.code, err.cause)


class ChannelExist(StreamingError):
    code = Code.STREAMING_CODE_CHANNEL_EXIST


class ChannelNotExist(StreamingError):
    code = Code.STREAMING_CODE_CHANNEL_NOT_EXIST


class ChannelFenced(StreamingError):
    code = Code.STREAMING_CODE_CHANNEL_FENCED


class OnShutdown(StreamingError):
    code = Code.STREAMING_CODE_ON_SHUTDOWN


class InvalidRequestSeq(StreamingError):
    code = Code.STREAMING_CODE_INVALID_REQUEST_SEQ


class UnmatchedChannelTerm(StreamingError):
    code = Code.STREAMING_CODE_UNMATCHED_CHANNEL_TERM


class IgnoredOperation(StreamingError):
    code = Code.STREAMING_CODE_IGNORED_OPERATION


class Inner(StreamingError):
    code = Code.STREAMING_CODE_INNER


class EOF(StreamingError):
    code = Code.STREAMING_CODE_EOF


class InvalidArgument(StreamingError):
    code = Code.STREAMING_CODE_INVAILD_ARGUMENT


class ResourceKeyConflict(StreamingError):
    """A broadcast's resource key is held by another broadcast (named in the cause)."""

    code = Code.STREAMING_CODE_RESOURCE_ACQUIRED


class BroadcastNotFound(StreamingError):
    """No such broadcast at the coord: never made, or its tombstone has expired."""

    code = Code.STREAMING_CODE_BROADCAST_NOT_FOUND


class Unsupported(StreamingError):
    """The deployment does not offer this operation (the cause says why)."""

    code = Code.STREAMING_CODE_UNSUPPORTED


class DataLoss(StreamingError):
    """The pchannel's log on this node lost records it acknowledged (corruption, a
    truncated WAL): it is not served until rebuilt or the loss is accepted."""

    code = Code.STREAMING_CODE_DATA_LOSS


class ResourceExhausted(StreamingError):
    """A limit was reached (a connection count, a buffer, a queue): the cause names the
    limit and its flag. Retry later, or elsewhere; nothing of the refused request was kept."""

    code = Code.STREAMING_CODE_RESOURCE_EXHAUSTED


class TransactionExpired(StreamingError):
    """The txn saw no append within its keepalive and was rolled back by the node."""

    code = Code.STREAMING_CODE_TRANSACTION_EXPIRED


class InvalidTransactionState(StreamingError):
    """The txn was committed, rolled back or lost (node restart, term change, stream end)."""

    code = Code.STREAMING_CODE_INVALID_TRANSACTION_STATE


class ConsumerGroupExist(StreamingError):
    code = Code.STREAMING_CODE_CONSUMER_GROUP_EXIST


class ConsumerGroupNotExist(StreamingError):
    code = Code.STREAMING_CODE_CONSUMER_GROUP_NOT_EXIST


_BY_CODE: dict[int, type[StreamingError]] = {
    cls.code: cls
    for cls in (
        ChannelExist,
        ChannelNotExist,
        ChannelFenced,
        OnShutdown,
        InvalidRequestSeq,
        UnmatchedChannelTerm,
        IgnoredOperation,
        Inner,
        EOF,
        InvalidArgument,
        ResourceKeyConflict,
        BroadcastNotFound,
        Unsupported,
        DataLoss,
        ResourceExhausted,
        TransactionExpired,
        InvalidTransactionState,
        ConsumerGroupExist,
        ConsumerGroupNotExist,
    )
}


def is_fencing_error(err: StreamingError) -> bool:
    """The pchannel is not (or no longer) served here under that term: look it up again."""
    return isinstance(err, ChannelFenced | ChannelNotExist | UnmatchedChannelTerm)


def error_for(code: int, cause: str) -> StreamingError:
    """The most specific StreamingError subclass for `code`."""
    cls = _BY_CODE.get(code)
    return cls(cause) if cls else StreamingError(cause, code)


class PermissionDenied(StreamingError):
    """The caller's certificate lacks the role or the pchannel for the call (docs/security.md):
    retrying cannot help. Made from the gRPC status; the cause names identity and method."""

    code = Code.STREAMING_CODE_UNKNOWN

    def __str__(self) -> str:
        return self.cause


class Unavailable(StreamingError):
    """The node could not be reached or the stream broke (no StreamingCode from the node)."""

    code = Code.STREAMING_CODE_UNKNOWN

    def __str__(self) -> str:
        return f"unavailable: {self.cause}"
