"""What the WAL accessor appends and answers: messages, options, per-message responses.

Pure data and decision code (no I/O): `group_by_vchannel` decides how `append_messages`
splits its input, `AppendResponses` puts per-group outcomes back in the caller's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from streamwal.client import encoding
from streamwal.errors import StreamingError
from streamwal.message import DEFAULT_MSG_TYPE, MsgType


@dataclass(frozen=True)
class Message:
    """A message to append (Milvus's MutableMessage): it names its vchannel."""

    vchannel: str
    payload: bytes = b""
    msg_type: int = DEFAULT_MSG_TYPE
    properties: Mapping[str, str] = field(default_factory=dict)

    def entry(self) -> bytes:
        """The encoded MessageBatch element; raises ValueError on a reserved property key."""
        props = encoding.message_properties(self.vchannel, int(self.msg_type), self.properties)
        return encoding.encode_entry(self.payload, encoding.encode_properties(props))

    @property
    def type_name(self) -> str:
        try:
            return MsgType(self.msg_type).name
        except ValueError:
            return str(self.msg_type)


@dataclass(frozen=True)
class AppendOption:
    """`barrier_time_tick`: the appended messages' ticks are all above it (0: none)."""

    barrier_time_tick: int = 0


@dataclass(frozen=True)
class AppendResult:
    """Where a message landed: its MessageID (offset in the pchannel) and time tick.

    `txn_id` is set when it was appended inside a transaction (all its messages share the
    commit's tick)."""

    vchannel: str
    message_id: int
    time_tick: int
    txn_id: int | None = None

    @property
    def offset(self) -> int:
        """The message id by its Kafka name: the offset in the pchannel."""
        return self.message_id


@dataclass(frozen=True)
class AppendResponse:
    """One message's outcome: a result or the error that kept it out of the log."""

    result: AppendResult | None = None
    error: StreamingError | None = None


@dataclass(frozen=True)
class AppendResponses:
    """Responses in the order the messages were given."""

    responses: list[AppendResponse]

    def unwrap(self) -> list[AppendResult]:
        """Every result, or the first error raised."""
        err = self.first_error()
        if err is not None:
            raise err
        return [r.result for r in self.responses if r.result is not None]

    def first_error(self) -> StreamingError | None:
        return next((r.error for r in self.responses if r.error is not None), None)

    def __len__(self) -> int:
        return len(self.responses)

    def __getitem__(self, i: int) -> AppendResponse:
        return self.responses[i]


def group_by_vchannel(msgs: Sequence[Message]) -> dict[str, list[int]]:
    """{vchannel: indexes of its messages, in input order}; vchannels in first-seen order.

    Each group is appended atomically (one transaction); nothing is promised across groups
    (the seed's AppendMessages makes no cross-vchannel promise either)."""
    groups: dict[str, list[int]] = {}
    for i, msg in enumerate(msgs):
        groups.setdefault(msg.vchannel, []).append(i)
    return groups


def gather_responses(
    count: int, outcomes: Iterable[tuple[list[int], list[AppendResult] | StreamingError]]
) -> AppendResponses:
    """Per-message responses from per-group outcomes: a group's error is each member's."""
    out: list[AppendResponse | None] = [None] * count
    for indexes, outcome in outcomes:
        for k, i in enumerate(indexes):
            if isinstance(outcome, StreamingError):
                out[i] = AppendResponse(error=outcome)
            else:
                out[i] = AppendResponse(result=outcome[k])
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise ValueError(f"messages {missing} belong to no group")
    return AppendResponses(out)  # type: ignore[arg-type]
