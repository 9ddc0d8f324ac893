"""Checks replicated pchannels after a fault run: every replica's log against what producers
got acknowledged and what consumers saw. Reusable by any test that records those.

Payloads are ``b"<producer>:<index>"`` (indices grow per producer); anything else in the
log (time ticks, foreign messages) only counts for density and for agreement between
replicas. The promises checked (issue 5's "Must show"):

- offsets are dense on every replica (records follow each other without gaps);
- replicas agree: the same message at every offset, and the same log end;
- every acknowledged message is on every replica exactly once, at its acknowledged offset;
- per producer, messages appear in the order they were sent;
- a consumer never saw a message that is not in the final log at the offset it saw it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamwal.node import records
from streamwal.node.peer import fetch
from streamwal.proto import streaming_pb2 as pb


@dataclass(frozen=True)
class Acked:
    """A message a producer got acknowledged at `offset`."""

    producer: str
    index: int
    offset: int

    @property
    def payload(self) -> bytes:
        return payload(self.producer, self.index)


def payload(producer: str, index: int) -> bytes:
    return f"{producer}:{index}".encode()


def parse_payload(data: bytes) -> tuple[str, int] | None:
    name, sep, index = data.decode(errors="replace").rpartition(":")
    return (name, int(index)) if sep and index.isdigit() else None


@dataclass
class ReplicaLog:
    """One replica's messages by offset (tick records hold b"") and where its log has gaps."""

    node: int
    messages: dict[int, bytes] = field(default_factory=dict)
    first: int = 0
    end: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (expected base, found base)


def parse_log(node: int, stored: Iterable[tuple[int, bytes]]) -> ReplicaLog:
    """A replica's log from its stored records (base offset, record bytes), in order."""
    log = ReplicaLog(node)
    expected: int | None = None
    for base, value in stored:
        record = records.decode(value, f"{node}@{base}")
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
        expected = base + record.count
    log.end = expected if expected is not None else 0
    return log


async def read_replica(node: int, address: str, pchannel: str) -> ReplicaLog:
    """Everything `node` stores of `pchannel`, read through Fetch (any role, any fence)."""
    got = []
    async for response in fetch(address, pchannel, 0, timeout=60):
        if response.record:
            got.append((response.base_offset, response.record))
    return parse_log(node, got)


async def read_replicas(
    members: Mapping[int, str], pchannel: str, timeout: float = 30.0
) -> dict[int, ReplicaLog]:
    """Every member's log (node -> address), read together until their ends agree.

    A leader appends idle time ticks, so logs read one after another rarely end alike;
    reads repeat (bounded) until one snapshot does. After `timeout` the last snapshot is
    returned and `check` reports the differing ends."""
    deadline = time.monotonic() + timeout
    while True:
        read = await asyncio.gather(*(read_replica(n, a, pchannel) for n, a in members.items()))
        logs = {log.node: log for log in read}
        if len({log.end for log in read}) == 1 or time.monotonic() > deadline:
            return logs
        await asyncio.sleep(0.2)


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    acknowledged: int = 0
    replicas: int = 0
    log_end: int = 0
    seen: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        if len(self.problems) < 50:  # enough to diagnose; the count is in the summary
            self.problems.append(problem)

    def summary(self) -> str:
        head = (
            f"{self.acknowledged} acknowledged messages, {self.seen} consumed, "
            f"{self.replicas} replicas ending at {self.log_end}"
        )
        return head + ("" if self.ok else ":\n  " + "\n  ".join(self.problems))


def check(
    logs: Mapping[int, ReplicaLog],
    acked: Iterable[Acked],
    seen: Iterable[tuple[int, bytes]] = (),
) -> Verdict:
    """Every promise above, over the replicas' `logs` (node -> log)."""
    acked = list(acked)
    seen = list(seen)
    verdict = Verdict(acknowledged=len(acked), replicas=len(logs), seen=len(seen))
    if not logs:
        verdict.add("no replica logs")
        return verdict
    ends = {n: log.end for n, log in logs.items()}
    verdict.log_end = max(ends.values())
    if len(set(ends.values())) > 1:
        verdict.add(f"replica log ends differ: {ends}")
    for node, log in logs.items():
        for want, got in log.gaps:
            verdict.add(f"node {node}: offsets not dense: record at {got}, expected {want}")
    _check_agreement(logs, verdict)
    for node, log in logs.items():
        _check_replica(node, log, acked, seen, verdict)
    return verdict


def _check_agreement(logs: Mapping[int, ReplicaLog], verdict: Verdict) -> None:
    first = max(log.first for log in logs.values())
    end = min(log.end for log in logs.values())
    ref_node, ref = next(iter(logs.items()))
    for offset in range(first, end):
        want = ref.messages.get(offset)
        for node, log in logs.items():
            if log.messages.get(offset) != want:
                verdict.add(
                    f"offset {offset}: node {node} holds {log.messages.get(offset)!r}, "
                    f"node {ref_node} {want!r}"
                )


def _check_replica(
    node: int,
    log: ReplicaLog,
    acked: list[Acked],
    seen: list[tuple[int, bytes]],
    verdict: Verdict,
) -> None:
    counts = Counter(body for body in log.messages.values() if body)
    for a in acked:
        got = log.messages.get(a.offset)
        if got != a.payload:
            verdict.add(f"node {node}: acknowledged {a.payload!r} at {a.offset}, log has {got!r}")
        if counts[a.payload] != 1:
            verdict.add(f"node {node}: {a.payload!r} stored {counts[a.payload]} times")
    last: dict[str, tuple[int, int]] = {}
    for offset in sorted(log.messages):
        parsed = parse_payload(log.messages[offset])
        if parsed is None:
            continue
        producer, index = parsed
        before = last.get(producer)
        if before is not None and index <= before[0]:
            verdict.add(
                f"node {node}: {producer} out of order: #{index} at {offset} "
                f"after #{before[0]} at {before[1]}"
            )
        last[producer] = (index, offset)
    for offset, body in seen:
        if log.messages.get(offset) != body:
            verdict.add(
                f"node {node}: a consumer saw {body!r} at {offset}, "
                f"the log has {log.messages.get(offset)!r}"
            )
