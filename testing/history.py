"""The one history checker: what a run acknowledged against what its logs hold. Pure.

Every harness that puts streamwal through faults records the same things: the messages
producers got acknowledged (`Acked`: producer, index, offset, and the term when known),
one or more copies of a pchannel's log (`Log`: each replica read raw, or what a consumer
read), and what consumers saw on the way. `check` holds them to the promises a
write-ahead log makes, and counts every breach by kind:

- ``lost``: an acknowledged message is not in the log;
- ``moved``: it is there, but not at the offset it was acknowledged at;
- ``duplicate``: a message is stored more than once;
- ``out_of_order``: a producer's messages appear in another order than it sent them;
- ``acked_twice``: one offset was acknowledged to two messages, or one message at two
  offsets;
- ``gap``: the offsets of a log that promises density (records read raw) have a hole;
- ``term_regression``: a record's term is below the term of a record before it;
- ``stale_term``: the record at an acknowledged offset is of a later term than the
  acknowledgement (a deposed owner acknowledged it, a newer term wrote over it; a resend
  answered by a newer owner may name a record of an older term, which is fine);
- ``divergent``: two copies hold different messages at one offset;
- ``ends_differ``: the copies do not end at the same offset (after catch-up they must);
- ``phantom``: a consumer saw a message the log does not hold at that offset.

Payloads are ``b"<producer>:<index>"`` with indices growing per producer (`payload`); any
other message (time ticks, foreign data) counts only for density and agreement. The
simulator, `streamwal dev`, the fault tests and the failover benchmark all check with this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamwal.node import records
from streamwal.proto import streaming_pb2 as pb

KINDS = (
    "lost",
    "moved",
    "duplicate",
    "out_of_order",
    "acked_twice",
    "gap",
    "term_regression",
    "stale_term",
    "divergent",
    "ends_differ",
    "phantom",
)
MAX_PROBLEMS = 50  # messages kept to diagnose; every breach is counted


def payload(producer: str, index: int) -> bytes:
    return f"{producer}:{index}".encode()


def parse_payload(data: bytes) -> tuple[str, int] | None:
    name, sep, index = data.decode(errors="replace").rpartition(":")
    return (name, int(index)) if sep and index.isdigit() else None


@dataclass(frozen=True)
class Acked:
    """A message a producer got acknowledged at `offset` (under `term`; 0: not known)."""

    producer: str
    index: int
    offset: int
    term: int = 0

    @property
    def payload(self) -> bytes:
        return payload(self.producer, self.index)


@dataclass
class Log:
    """One copy of a pchannel's log: message bodies by offset (time ticks hold b"").

    `terms` holds each offset's record term where the copy knows it (read raw); `dense`
    says whether the copy promises consecutive offsets (raw records do; a consumer skips
    time ticks), and `gaps` where that promise broke (expected offset, found offset).
    """

    source: str
    messages: dict[int, bytes] = field(default_factory=dict)
    terms: dict[int, int] = field(default_factory=dict)
    first: int = 0
    end: int = 0
    dense: bool = True
    gaps: list[tuple[int, int]] = field(default_factory=list)


def parse_log(source: str, stored: Iterable[tuple[int, bytes]]) -> Log:
    """A copy from its stored records (base offset, record bytes), in offset order."""
    log = Log(source)
    expected: int | None = None
    for base, value in stored:
        record = records.decode(value, f"{source}@{base}")
        if expected is None:
            log.first = base
        elif base != expected:
            log.gaps.append((expected, base))
        if record.flags & records.FLAG_TIME_TICK:
            bodies = [b""] * record.count
        else:
            bodies = [m.payload for m in pb.MessageBatch.FromString(record.body).messages]
        for i, body in enumerate(bodies):
            log.messages[base + i] = body
            log.terms[base + i] = record.term
        expected = base + record.count
    log.end = expected if expected is not None else 0
    return log


def read_log(source: str, seen: Iterable[tuple[int, bytes]]) -> Log:
    """A copy as a consumer read it: (offset, payload) pairs; not dense (ticks skipped)."""
    log = Log(source, dense=False)
    for offset, body in seen:
        if not log.messages:
            log.first = offset
        log.messages[offset] = body
        log.end = max(log.end, offset + 1)
    return log


@dataclass
class Verdict:
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    acknowledged: int = 0
    copies: int = 0
    log_end: int = 0
    seen: int = 0
    read_back: int = 0  # producers' messages found in the first copy
    unacknowledged: int = 0  # of those, never acknowledged (allowed: the ack was lost)

    @property
    def ok(self) -> bool:
        return not self.counts

    def add(self, kind: str, problem: str) -> None:
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{kind}: {problem}")

    def merge(self, other: Verdict) -> None:
        """Fold another pchannel's verdict into this one (a run over many pchannels)."""
        self.counts.update(other.counts)
        self.problems.extend(other.problems[: max(0, MAX_PROBLEMS - len(self.problems))])
        self.acknowledged += other.acknowledged
        self.copies += other.copies
        self.log_end = max(self.log_end, other.log_end)
        self.seen += other.seen
        self.read_back += other.read_back
        self.unacknowledged += other.unacknowledged

    def summary(self) -> str:
        head = (
            f"{self.acknowledged} acknowledged messages, {self.seen} consumed, "
            f"{self.copies} copies ending at {self.log_end}"
        )
        if self.ok:
            return head
        counted = ", ".join(f"{k} {self.counts[k]}" for k in KINDS if self.counts[k])
        return f"{head}; {counted}:\n  " + "\n  ".join(self.problems)


def check(
    logs: Mapping[object, Log] | Iterable[Log],
    acked: Iterable[Acked],
    seen: Iterable[tuple[int, bytes]] = (),
) -> Verdict:
    """Every promise in the module docstring, over the copies `logs` of one pchannel."""
    copies = list(logs.values()) if isinstance(logs, Mapping) else list(logs)
    acked = list(acked)
    seen = list(seen)
    verdict = Verdict(acknowledged=len(acked), copies=len(copies), seen=len(seen))
    _check_acks(acked, verdict)
    if not copies:
        if acked:
            verdict.add("lost", f"no copy of the log holds the {len(acked)} acknowledged")
        return verdict
    ends = {log.source: log.end for log in copies}
    verdict.log_end = max(ends.values())
    if len(set(ends.values())) > 1:
        verdict.add("ends_differ", f"copies end at {ends}")
    _check_agreement(copies, verdict)
    for log in copies:
        _check_copy(log, acked, seen, verdict)
    _count_read_back(copies[0], acked, verdict)
    return verdict


def acked_twice(acked: Iterable[Acked]) -> list[str]:
    """What the acknowledgements alone say is wrong: an offset acknowledged to two
    messages (a log that lost its end and handed offsets out again), or one message at
    two offsets."""
    at: dict[int, bytes] = {}
    where: dict[bytes, int] = {}
    out = []
    for a in acked:
        body = a.payload
        if at.setdefault(a.offset, body) != body:
            out.append(f"offset {a.offset} acknowledged to {at[a.offset]!r} and {body!r}")
        if where.setdefault(body, a.offset) != a.offset:
            out.append(f"{body!r} acknowledged at {where[body]} and {a.offset}")
    return out


def _check_acks(acked: list[Acked], verdict: Verdict) -> None:
    for problem in acked_twice(acked):
        verdict.add("acked_twice", problem)


def _check_agreement(copies: list[Log], verdict: Verdict) -> None:
    first = max(log.first for log in copies)
    end = min(log.end for log in copies)
    ref = copies[0]
    for offset in range(first, end):
        want = ref.messages.get(offset)
        for log in copies[1:]:
            got = log.messages.get(offset)
            # A consumer's copy skips time ticks: only offsets both copies hold compare.
            both = (ref.dense and log.dense) or None not in (got, want)
            if got != want and both:
                verdict.add(
                    "divergent",
                    f"offset {offset}: {log.source} holds {got!r}, {ref.source} {want!r}",
                )


def _check_copy(log: Log, acked: list[Acked], seen: list[tuple[int, bytes]], v: Verdict) -> None:
    if log.dense:
        for expected, found in log.gaps:
            v.add("gap", f"{log.source}: record at {found}, expected {expected}")
    last_term, last_at = 0, 0
    for offset in sorted(log.terms):
        term = log.terms[offset]
        if term < last_term:
            v.add(
                "term_regression",
                f"{log.source}: term {term} at {offset} after term {last_term} at {last_at}",
            )
        last_term, last_at = max(last_term, term), offset
    stored: dict[bytes, list[int]] = {}
    for offset in sorted(log.messages):
        body = log.messages[offset]
        if body:
            stored.setdefault(body, []).append(offset)
    for body, offsets in stored.items():
        if len(offsets) > 1 and parse_payload(body) is not None:
            v.add("duplicate", f"{log.source}: {body!r} stored at {offsets}")
    for a in acked:
        got = log.messages.get(a.offset)
        held = log.terms.get(a.offset)
        if a.term and held is not None and held > a.term:
            v.add(
                "stale_term",
                f"{log.source}: {a.payload!r} acknowledged at {a.offset} under term "
                f"{a.term}, the offset holds a record of term {held}",
            )
        if got == a.payload:
            continue
        if a.payload in stored:
            v.add(
                "moved",
                f"{log.source}: {a.payload!r} acknowledged at {a.offset}, "
                f"stored at {stored[a.payload]}",
            )
        else:
            v.add(
                "lost", f"{log.source}: acknowledged {a.payload!r} at {a.offset}, log has {got!r}"
            )
    _check_order(log, stored, v)
    for offset, body in seen:
        if log.first <= offset < log.end and log.messages.get(offset) != body:
            v.add(
                "phantom",
                f"{log.source}: a consumer saw {body!r} at {offset}, "
                f"the log has {log.messages.get(offset)!r}",
            )


def _check_order(log: Log, stored: Mapping[bytes, list[int]], v: Verdict) -> None:
    """Per producer, indices grow with the offsets (a duplicate's later copies skipped)."""
    last: dict[str, tuple[int, int]] = {}
    for offset in sorted(log.messages):
        body = log.messages[offset]
        parsed = parse_payload(body) if body else None
        if parsed is None or stored[body][0] != offset:
            continue
        producer, index = parsed
        before = last.get(producer)
        if before is not None and index < before[0]:
            v.add(
                "out_of_order",
                f"{log.source}: {producer} #{index} at {offset} after #{before[0]} at {before[1]}",
            )
        if before is None or index > before[0]:
            last[producer] = (index, offset)


def _count_read_back(log: Log, acked: list[Acked], v: Verdict) -> None:
    producers = {a.producer for a in acked}
    bodies = {a.payload for a in acked}
    for body in log.messages.values():
        parsed = parse_payload(body) if body else None
        if parsed is not None and parsed[0] in producers:
            v.read_back += 1
            v.unacknowledged += body not in bodies
