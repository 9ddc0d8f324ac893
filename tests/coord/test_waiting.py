"""A pchannel without a leader says why, and elections retried under load converge under
one term (issue 24's sc_226): the executor and records with nodes faked at the link."""

from __future__ import annotations

from streamwal.coord import planner as pl
from streamwal.coord import sagas
from streamwal.coord import state_machine as sm
from streamwal.coord.channel_records import ChannelRecords
from streamwal.coord.executor import Executor
from streamwal.coord.memory import Memory
from streamwal.coord.meta_store import MemoryMetaStore
from streamwal.coord.metrics import CoordMetrics
from streamwal.errors import Unavailable
from streamwal.proto import streaming_pb2 as pb
from tests.coord.test_planner import NODES, replicated
from tests.coord.test_sagas import ctx


class Links:
    """Nodes whose Fence times out while `slow` names them."""

    def __init__(self) -> None:
        self.slow: set[int] = set()
        self.terms: list[int] = []

    async def fence(self, address, name, term, timeout) -> pb.FenceResponse:
        node = next(n for n, a in NODES.items() if a == address)
        self.terms.append(term)
        if node in self.slow:
            raise Unavailable("DEADLINE_EXCEEDED")
        return pb.FenceResponse(last_term=1, next_offset=27 if node == 3 else 20)

    async def assign(self, address, name, term, timeout, **_kw) -> None:
        return None

    async def remove(self, address, name, term, timeout) -> None:
        return None


async def test_no_leader_says_why_and_the_retry_converges_under_one_term():
    store, metrics, memory = MemoryMetaStore(), CoordMetrics(), Memory()
    records = ChannelRecords(store, metrics)
    await records.load(1)
    before = replicated("sc_226", members=(1, 2, 3), leader=1, term=1).record
    await records.persist("sc_226", before)
    links = Links()
    executor = Executor(
        records, links, memory, metrics, lambda: 0.0, lambda *_: None, lambda *_: None, ()
    )
    round_ = ctx(alive=(2, 3, 4), lost=(1,))
    links.slow = {2, 3}  # loaded: their answers miss the deadline
    for _ in range(3):
        stored = records.get("sc_226")
        job = pl.ChangeTerm("sc_226", stored.version, (2, 3, 4), "failover")
        assert await executor.run_job(job, round_) == sagas.Failed()
        assert "no majority" in memory.waiting["sc_226"]
        sample = metrics.registry.get_sample_value(
            "streamwal_pchannel_waiting", {"pchannel": "sc_226", "cause": "no-leader"}
        )
        assert sample == 1
    assert records.get("sc_226").record.meta.channel.term == 2  # not 2, 3, 4
    links.slow = set()
    stored = records.get("sc_226")
    job = pl.ChangeTerm("sc_226", stored.version, (2, 3, 4), "failover")
    done = await executor.run_job(job, round_)
    meta = records.get("sc_226").record.meta
    assert isinstance(done, sagas.Assigned) and done.fields["new_node"] == 3  # its log is best
    assert (meta.state, meta.channel.term) == (sm.ASSIGNED, 2)
    assert set(links.terms) == {2} and "sc_226" not in memory.waiting
    assert (
        metrics.registry.get_sample_value(
            "streamwal_pchannel_waiting", {"pchannel": "sc_226", "cause": "no-leader"}
        )
        is None
    )


async def test_the_records_per_node_follow_every_change():
    """ChannelRecords.held (what a node's report is checked against per probe, issue 24)
    follows persists, moves and destroys."""
    records = ChannelRecords(MemoryMetaStore(), CoordMetrics())
    await records.load(1)
    await records.persist("r", replicated("r", members=(1, 2, 3), leader=1).record)
    await records.persist("s", replicated("s", members=(2, 3, 4), leader=4).record)
    assert {n: set(v) for n, v in records.held().items()} == {
        1: {"r"}, 2: {"r", "s"}, 3: {"r", "s"}, 4: {"s"}
    }  # fmt: skip
    moved = records.copy("r")
    del moved.members[:]
    moved.members.extend(replicated("x", members=(2, 3, 4)).record.members)
    moved.meta.node.CopyFrom(moved.members[0])
    await records.persist("r", moved)
    gone = records.copy("s")
    gone.destroyed = True
    await records.persist("s", gone)
    assert {n: set(v) for n, v in records.held().items()} == {2: {"r"}, 3: {"r"}, 4: {"r"}}
