"""The producer's ledger, alone: no node, no asyncio, no processes.

A scripted node (`FakeNode`) stores batches the way a streaming node does for an
idempotent producer: a batch whose sequence it already holds is answered with its
original offset, never stored twice. Each case runs a script of producer and network
events and checks what the node stored and what each send was answered; the seeded walk
at the end runs random scripts (reroutes, lost answers, lost frames) against the
promises: every accepted op answered exactly once, sequence numbers only grow per
producer, and per-producer order holds across resends.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from streamwal.client.produce_ledger import (
    DETACHED,
    DONE,
    IN_FLIGHT,
    QUEUED,
    Batch,
    Op,
    ProduceLedger,
    TxnOp,
)


def ledger(max_in_flight: int = 8, max_batch_messages: int = 100, **kw) -> ProduceLedger:
    return ProduceLedger(
        idempotent=kw.pop("idempotent", True),
        max_in_flight=max_in_flight,
        max_batch_bytes=kw.pop("max_batch_bytes", 1 << 20),
        max_batch_messages=max_batch_messages,
    )


@dataclass
class FakeNode:
    """Stores batches (lists of payloads) at dense offsets; idempotent by sequence."""

    log: list[bytes] = field(default_factory=list)
    results: dict[int, int] = field(default_factory=dict)  # sequence -> base offset
    last_sequence: int = 0

    def store(self, op: Op) -> int:
        assert isinstance(op, Batch)
        if op.sequence and op.sequence in self.results:
            return self.results[op.sequence]  # a resend: the original answer
        base = len(self.log)
        self.log.extend(op.entries)
        if op.sequence:
            self.results[op.sequence] = base
            self.last_sequence = max(self.last_sequence, op.sequence)
        return base


@dataclass
class Run:
    """A producer over streams to `node`; a reroute moves it to a new ledger."""

    node: FakeNode = field(default_factory=FakeNode)
    ledger: ProduceLedger = field(default_factory=ledger)
    wire: list[Op] = field(default_factory=list)  # dispatched, not yet at the node
    stored: list[tuple[Op, int]] = field(default_factory=list)  # at the node, unanswered
    answers: dict[bytes, int] = field(default_factory=dict)  # payload -> offset answered
    failed: list[Op] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)  # as dispatched, in order
    accepted: list[Op] = field(default_factory=list)
    now: float = 0.0

    def send(self, *payloads: bytes) -> None:
        for p in payloads:
            batch, index = self.ledger.add(p)
            if index == 0:
                self.accepted.append(batch)

    def batch(self, *payloads: bytes, sequence: int = 0) -> None:
        self.accepted.append(self.ledger.add_batch(list(payloads), sequence=sequence))

    def dispatch(self) -> None:
        while (op := self.ledger.dispatch(self.now)) is not None:
            self.now += 1
            self.wire.append(op)
            if op.numbered and op.sequence:
                self.sequences.append(op.sequence)

    def deliver(self, lose_answer: bool = False) -> None:
        """The node stores every frame on the wire; answers come back unless lost."""
        for op in self.wire:
            self.stored.append((op, self.node.store(op)))
        self.wire.clear()
        if not lose_answer:
            self.answer()

    def answer(self) -> None:
        for op, base in self.stored:
            settled = self.ledger.settle(op.request_id)
            if settled is None:
                continue  # answered after a detach: the resend answers it
            assert settled is op and op.state == DONE
            for i, payload in enumerate(op.entries):  # type: ignore[attr-defined]
                assert payload not in self.answers, f"{payload!r} answered twice"
                self.answers[payload] = base + i
        self.stored.clear()

    def reroute(self, early: bytes | None = None) -> None:
        """The stream dies; a new ledger (learning the node's last sequence) adopts. An
        `early` send reaches the new ledger before the adoption (and must go after)."""
        resend, lost = self.ledger.detach()
        self.failed += lost
        assert all(op.state == DETACHED for op in resend)
        self.wire.clear()  # frames never delivered
        self.stored.clear()  # answers never delivered
        carried = self.ledger.next_sequence
        self.ledger = ledger(self.ledger.max_in_flight, self.ledger.max_batch_messages)
        self.ledger.learn_last_sequence(self.node.last_sequence)
        if early is not None:
            self.send(early)
        self.ledger.adopt(resend, carried)


CASES = {
    "lone sends: a frame each, numbered 1, 2, 3": (
        ["send a", "dispatch", "deliver", "send b", "dispatch", "deliver", "send c",
         "dispatch", "deliver"],
        [b"a", b"b", b"c"], [1, 2, 3],
    ),
    "sends while slots are taken share the next frame": (
        ["slots 1", "send a", "dispatch", "send b", "send c", "dispatch", "deliver",
         "dispatch", "deliver"],
        [b"a", b"b", b"c"], [1, 2],
    ),
    "a send never joins a batch accepted before a send_batch": (
        ["slots 1", "send a", "dispatch", "send b", "batch x y", "send c", "deliver",
         "dispatch", "deliver", "dispatch", "deliver", "dispatch", "deliver"],
        [b"a", b"b", b"x", b"y", b"c"], [1, 2, 3, 4],
    ),
    "answer lost: the resend is answered with the original offset, stored once": (
        ["send a", "dispatch", "deliver lost", "send b", "reroute", "dispatch", "deliver"],
        [b"a", b"b"], [1, 1, 2],
    ),
    "frame lost: the resend is stored once, in order before newer sends": (
        ["send a", "dispatch", "send b", "reroute", "send c", "dispatch", "deliver"],
        [b"a", b"b", b"c"], [1, 1, 2, 3],
    ),
    "a send that reaches the new stream first still goes after the resent ones": (
        ["send a", "dispatch", "reroute b", "dispatch", "deliver"],
        [b"a", b"b"], [1, 1, 2],
    ),
    "two reroutes in a row keep numbers and order": (
        ["send a", "dispatch", "reroute", "send b", "dispatch", "deliver lost", "reroute",
         "send c", "dispatch", "deliver"],
        [b"a", b"b", b"c"], [1, 1, 2, 1, 2, 3],
    ),
    "a pinned sequence is kept and later numbers go above it": (
        ["batch p sequence=7", "send a", "dispatch", "deliver"],
        [b"p", b"a"], [7, 8],
    ),
    "the node's last sequence lifts the numbering after a reroute": (
        ["send a", "dispatch", "deliver", "node-last 40", "send b", "reroute", "dispatch",
         "deliver"],
        [b"a", b"b"], [1, 41],
    ),
}  # fmt: skip


@pytest.mark.parametrize("script, log, sequences", CASES.values(), ids=CASES.keys())
def test_scripts(script: list[str], log: list[bytes], sequences: list[int]) -> None:
    run = Run()
    for step in script:
        verb, *args = step.split()
        if verb == "slots":
            run.ledger = ledger(int(args[0]))
        elif verb == "send":
            run.send(*(a.encode() for a in args))
        elif verb == "batch":
            pinned = [int(a.split("=")[1]) for a in args if a.startswith("sequence=")]
            payloads = [a.encode() for a in args if "=" not in a]
            run.batch(*payloads, sequence=pinned[0] if pinned else 0)
        elif verb == "dispatch":
            run.dispatch()
        elif verb == "deliver":
            run.deliver(lose_answer=args == ["lost"])
        elif verb == "reroute":
            run.reroute(args[0].encode() if args else None)
        elif verb == "node-last":
            run.node.last_sequence = int(args[0])
        else:
            raise AssertionError(step)
    assert run.node.log == log
    assert run.sequences == sequences
    assert run.ledger.quiet
    assert {p: run.node.log.index(p) for p in log} == run.answers  # each answered once


def test_txn_ops_keep_their_place_and_only_a_sent_commit_follows_a_reroute() -> None:
    lg = ledger(max_in_flight=8)
    lg.add(b"a")
    begin = lg.add_txn("begin", commit=False)
    lg.add(b"b")  # after the begin, not in the batch before it
    commit = lg.add_txn("commit", commit=True)
    sent = [lg.dispatch(0.0) for _ in range(4)]
    assert [type(op).__name__ for op in sent] == ["Batch", "TxnOp", "Batch", "TxnOp"]
    assert [op.sequence for op in sent] == [1, 0, 2, 3]  # begin takes no number
    queued_commit = lg.add_txn("commit 2", commit=True)
    resend, lost = lg.detach()
    assert lost == [begin, queued_commit]  # a txn lives on its node; a commit never sent too
    assert resend == [sent[0], sent[2], commit] and commit.sequence == 3
    fresh = ledger()
    fresh.adopt(resend, lg.next_sequence)
    again = [fresh.dispatch(1.0) for _ in range(3)]
    assert again == resend and [op.sequence for op in again] == [1, 2, 3]


def test_fail_all_hands_back_every_owed_op_once() -> None:
    lg = ledger(max_in_flight=1)
    first, _ = lg.add(b"a")
    lg.dispatch(0.0)
    second = lg.add_batch([b"b"])
    third = lg.add_txn("rollback", commit=False)
    owed = lg.fail_all()
    assert owed == [first, second, third] and all(op.state == DONE for op in owed)
    assert lg.fail_all() == [] and lg.ended
    assert lg.settle(first.request_id) is None  # a late answer changes nothing
    with pytest.raises(AssertionError):
        lg.add(b"late")


def test_a_late_answer_after_detach_is_ignored_and_a_second_answer_too() -> None:
    lg = ledger()
    op, _ = lg.add(b"a")
    lg.dispatch(0.0)
    assert lg.settle(op.request_id) is op
    assert lg.settle(op.request_id) is None  # answered once
    other, _ = lg.add(b"b")
    lg.dispatch(1.0)
    resend, _ = lg.detach()
    assert resend == [other] and lg.settle(other.request_id) is None


def test_adopting_behind_ops_already_sent_is_refused() -> None:
    old = ledger()
    old.add(b"a")
    old.dispatch(0.0)
    resend, _ = old.detach()
    new = ledger()
    new.add(b"b")
    new.dispatch(0.0)
    with pytest.raises(AssertionError, match="reorder"):
        new.adopt(resend)


def test_slots_and_the_oldest_request() -> None:
    lg = ledger(max_in_flight=2, max_batch_messages=1)
    ops = [lg.add(p)[0] for p in (b"a", b"b", b"c")]
    assert lg.oldest_sent_at() is None
    assert lg.dispatch(5.0) is ops[0] and lg.dispatch(6.0) is ops[1]
    assert lg.dispatch(7.0) is None and not lg.can_dispatch  # both slots taken
    assert lg.oldest_sent_at() == 5.0
    lg.settle(ops[0].request_id)
    assert lg.oldest_sent_at() == 6.0 and lg.dispatch(8.0) is ops[2]
    assert [op.state for op in ops] == [DONE, IN_FLIGHT, IN_FLIGHT]


def test_batches_close_at_their_limits() -> None:
    lg = ledger(max_in_flight=1, max_batch_messages=2, max_batch_bytes=10)
    placed = [lg.add(p) for p in (b"aa", b"bb", b"cc", b"x" * 9, b"dd")]
    batches = {id(b) for b, _ in placed}
    assert [i for _, i in placed] == [0, 1, 0, 0, 0]  # 2 messages, then 10 bytes, close
    assert len(batches) == 4 and lg.queued == 4 and placed[0][0].state == QUEUED


def test_without_idempotence_nothing_is_numbered_or_resent() -> None:
    lg = ledger(idempotent=False)
    lg.add(b"a")
    assert lg.dispatch(0.0).sequence == 0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="pinned sequence"):
        lg.add_batch([b"x"], sequence=3)
    with pytest.raises(AssertionError, match="idempotent"):
        lg.detach()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ledger(max_in_flight=0)


def _walk(seed: int) -> None:
    """A random producer life: sends, batches, txn commits, deliveries (answers lost
    now and then), frames lost with their stream, reroutes; then everything settles."""
    rng = random.Random(seed)
    run = Run(ledger=ledger(rng.randint(1, 4), rng.randint(1, 5)))
    count = 0
    for _ in range(rng.randint(5, 60)):
        roll = rng.random()
        if roll < 0.35:
            run.send(*(f"m{count + i}".encode() for i in range(rng.randint(1, 3))))
            count += 3
        elif roll < 0.45:
            run.batch(*(f"m{count + i}".encode() for i in range(rng.randint(1, 3))))
            count += 3
        elif roll < 0.7:
            run.dispatch()
        elif roll < 0.9:
            run.deliver(lose_answer=rng.random() < 0.3)
        else:
            run.reroute(f"m{count}".encode() if rng.random() < 0.3 else None)
            count += 3
    for _ in range(500):  # the end: the stream works until everything is answered
        run.dispatch()
        run.deliver()
        if run.ledger.quiet:
            break
    accepted = [p for op in run.accepted for p in op.entries]  # type: ignore[attr-defined]
    assert run.ledger.quiet, f"seed {seed}: ops left unanswered"
    assert all(op.state == DONE for op in run.accepted), f"seed {seed}"
    # Every accepted message answered once, stored once, at the answered offset, and in
    # the order accepted (a payload's number is its acceptance rank).
    assert run.node.log == accepted, f"seed {seed}: {run.node.log} != {accepted}"
    assert run.answers == {p: i for i, p in enumerate(accepted)}, f"seed {seed}"
    # Sequence numbers only grow, except that a resend repeats its own (never another's).
    first_use: dict[int, int] = {}
    for position, seq in enumerate(run.sequences):
        first_use.setdefault(seq, position)
    fresh = [seq for position, seq in enumerate(run.sequences) if first_use[seq] == position]
    assert fresh == sorted(fresh) and len(set(fresh)) == len(fresh), f"seed {seed}"


@pytest.mark.parametrize("block", range(4))
def test_random_lives_keep_every_promise(block: int) -> None:
    for seed in range(block * 250, (block + 1) * 250):
        _walk(seed)


def test_txn_op_numbering_is_only_for_commits() -> None:
    assert not TxnOp("begin", commit=False).numbered and TxnOp("c", commit=True).numbered
