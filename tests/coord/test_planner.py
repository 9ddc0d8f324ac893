"""Whole reconcile rounds as tables: a cluster's records, memory and liveness in, the
round's jobs out (coord/planner.py, pure: no node, no store, no clock)."""

from __future__ import annotations

import dataclasses

import pytest

from streamwal.coord import catch_up
from streamwal.coord import planner as pl
from streamwal.coord import replica_set as rs
from streamwal.coord import state_machine as sm
from streamwal.coord.memory import Memory, NodeReport
from streamwal.coord.meta_store import Stored
from streamwal.proto import coord_pb2 as cpb
from streamwal.proto import streaming_pb2 as pb

NODES = {n: f"127.0.0.1:{1000 + n}" for n in (1, 2, 3, 4)}
LEADER, FOLLOWER = pb.REPLICA_ROLE_LEADER, pb.REPLICA_ROLE_FOLLOWER
WAITING = catch_up.WAITING_FOR_REPLICA


def ref(node: int) -> sm.NodeRef:
    return sm.NodeRef(node, NODES[node])


def single(
    name: str,
    state=sm.ASSIGNED,
    node: int | None = 1,
    term: int = 1,
    allow_data_loss: bool = False,
    history: int | None = None,
) -> Stored:
    meta = pb.PChannelMeta(channel=pb.PChannelInfo(name=name, term=term), state=state)
    if node is not None:
        meta.node.CopyFrom(ref(node).to_proto())
    if history is not None:  # a move under way started from this node
        meta.histories.add(term=term - 1, node=ref(history).to_proto())
    if state == sm.UNINITIALIZED:
        meta = sm.new_channel(name)
    record = cpb.ChannelRecord(meta=meta, replicas=1, allow_data_loss=allow_data_loss)
    return Stored(record, f"v-{name}")


def replicated(
    name: str, members=(1, 2, 3), leader: int = 1, term: int = 1, state=sm.ASSIGNED, previous=()
) -> Stored:
    stored = single(name, state, leader if members else None, term)
    record = stored.record
    record.replicas = 3
    record.members.extend(ref(n).to_proto() for n in members)
    record.previous_members.extend(ref(n).to_proto() for n in previous)
    return Stored(record, stored.version)


def status(name: str, term: int, role=LEADER, progress=()) -> pb.PChannelStatus:
    return pb.PChannelStatus(
        pchannel=pb.PChannelInfo(name=name, term=term),
        role=role,
        replicas=[pb.ReplicaProgress(node_id=n, acked_offset=a, lag=lag) for n, a, lag in progress],
    )


def round_of(
    records,
    alive=(1, 2, 3, 4),
    live=None,
    memory: Memory | None = None,
    drained=(),
    rechecked=(),
    down=(),
    rebalance=False,
    max_moves=1,
    now=100.0,
    nodes=NODES,
    grace=30.0,
    labels=None,
    domains=None,
    dirty=None,
) -> pl.Plan:
    snapshot = pl.Snapshot(
        records={s.name: s for s in records},
        nodes=nodes,
        drained=frozenset(drained),
        memory=memory or Memory(),
        rebalance_due=rebalance,
        max_moves=max_moves,
        grace=grace,
        labels=labels or {},
        domains=domains or {},
    )
    seen = pl.Observations(
        alive=frozenset(alive),
        live=frozenset(alive if live is None else live),
        lost=frozenset(set(nodes) - set(alive)),
        rechecked=frozenset(rechecked),
        down=frozenset(down),
    )
    return pl.plan(snapshot, seen, now, dirty)


def kinds(plan: pl.Plan) -> list[tuple]:
    """Each job as a short tuple: (kind, pchannel, detail)."""
    out = []
    for job in plan.assign + plan.fence + plan.rebalance:
        if isinstance(job, pl.Reassign):
            out.append(("reassign", job.name, job.reason, job.target and job.target.server_id))
        elif isinstance(job, pl.ChangeTerm):
            out.append(("term", job.name, job.reason, job.members))
        elif isinstance(job, pl.Rejoin):
            out.append(("rejoin", job.name, job.nodes))
        elif isinstance(job, pl.MarkUnavailable):
            out.append(("unavailable", job.name, job.code or job.reason))
        elif isinstance(job, pl.CompleteJoint):
            out.append(("joint-done", job.name))
        elif isinstance(job, pl.ApplyRetention):
            out.append(("retention", job.name))
        elif isinstance(job, pl.Unschedulable):
            out.append(("unschedulable", job.name, job.reason))
        else:
            out.append(("remove", job.name, job.term, job.node.server_id))
    return out


# ----------------------------------------------------------------- single replica


ROUNDS = {
    "new pchannels spread over the live nodes, least loaded first": (
        dict(records=[single(f"c{i}", sm.UNINITIALIZED) for i in range(4)], alive=(1, 2)),
        [
            ("reassign", "c0", "placement", 1),
            ("reassign", "c1", "placement", 2),
            ("reassign", "c2", "placement", 1),
            ("reassign", "c3", "placement", 2),
        ],
    ),
    "an owner declared lost: its single copy waits for it (safe failover), the others stay": (
        dict(records=[single("a", node=1), single("b", node=2)], alive=(2, 3)),
        [("unavailable", "a", WAITING)],
    ),
    "an owner declared lost, data loss allowed: an unclean failover, the others stay": (
        dict(
            records=[single("a", node=1, allow_data_loss=True), single("b", node=2)], alive=(2, 3)
        ),
        [("reassign", "a", "failover", 3)],
    ),
    "a waiting pchannel is not marked again while its node stays away": (
        dict(records=[single("a", sm.UNAVAILABLE, node=1)], alive=(2, 3)),
        [],
    ),
    "its node back: a waiting pchannel returns there, with its own log": (
        # node 1 already leads b and c: the balancer alone would have chosen 2 or 3
        dict(
            records=[single("a", sm.UNAVAILABLE, node=1), single("b"), single("c")],
            alive=(1, 2, 3),
        ),
        [("reassign", "a", "failover", 1)],
    ),
    "its node back in the set but not probed yet: the pchannel waits one more round": (
        dict(records=[single("a", sm.UNAVAILABLE, node=1)], alive=(1, 2, 3), live=(2, 3)),
        [],
    ),
    "a move under way whose source node is gone waits, without a job": (
        dict(records=[single("a", sm.ASSIGNING, node=2, term=2, history=1)], alive=(3,)),
        [],
    ),
    "data loss allowed, its pod left the node set within the grace: it waits": (
        dict(
            records=[single("a", node=1, allow_data_loss=True)],
            nodes={n: a for n, a in NODES.items() if n != 1},
            alive=(2, 3, 4),
            memory=Memory(lost_at={1: 90.0}),
        ),
        [
            (
                "unavailable",
                "a",
                "node 1 holds the only copy of its log and is gone: an "
                "unclean failover in 20s unless it returns",
            )
        ],
    ),
    "data loss allowed, its pod gone for longer than the grace: an unclean failover": (
        dict(
            records=[single("a", node=1, allow_data_loss=True)],
            nodes={n: a for n, a in NODES.items() if n != 1},
            alive=(2, 3, 4),
            memory=Memory(lost_at={1: 60.0}),
        ),
        [("reassign", "a", "failover", 2)],
    ),
    "a suspect owner (alive, not live) keeps its pchannel for the grace period": (
        dict(records=[single("a", node=1)], alive=(1, 2), live=(2,)),
        [],
    ),
    "a half-done move to a live target resumes": (
        dict(records=[single("a", sm.ASSIGNING, node=2, term=2)]),
        [("reassign", "a", "resume", None)],
    ),
    "a half-done move whose Assign failed goes elsewhere": (
        dict(
            records=[single("a", sm.ASSIGNING, node=2, term=2)],
            memory=Memory(failed_target={"a": 2}),
            alive=(1, 2, 3),
        ),
        [("reassign", "a", "failover", 1)],
    ),
    "no live node: an orphan is marked unavailable, a new pchannel just waits": (
        dict(
            records=[single("a", node=1, allow_data_loss=True), single("n", sm.UNINITIALIZED)],
            alive=(),
        ),
        [("unavailable", "a", "")],
    ),
    "a single copy that lost acknowledged records is neither moved nor re-assigned": (
        dict(
            records=[single("a", sm.UNAVAILABLE, node=1)],
            memory=Memory(data_loss={"a": "log shorter than acknowledged"}),
        ),
        [],
    ),
    "a pchannel a client reported, confirmed missing on its owner, is re-assigned": (
        # on the least loaded live node: its own owner again, under a higher term
        dict(records=[single("a", node=1), single("b", node=2)], rechecked=("a",)),
        [("reassign", "a", "recheck", 1)],
    ),
}


@pytest.mark.parametrize("case", list(ROUNDS))
def test_single_replica_rounds(case: str) -> None:
    given, jobs = ROUNDS[case]
    assert kinds(round_of(**given)) == jobs


def test_an_owner_probed_after_the_assignment_without_it_is_rechecked_not_before() -> None:
    records = [single("a", node=1, term=3)]
    before = Memory(reports={1: NodeReport.of(5.0, [])}, assigned_at={"a": 6.0})
    assert kinds(round_of(records, memory=before)) == []
    after = Memory(reports={1: NodeReport.of(7.0, [])}, assigned_at={"a": 6.0})
    assert kinds(round_of(records, memory=after)) == [("reassign", "a", "recheck", 1)]


def test_stale_and_unknown_pchannels_on_a_node_are_removed_members_are_not() -> None:
    records = [
        single("a", node=2, term=4),
        replicated("r", members=(1, 2, 3), leader=2, term=7),
        single("gone", node=1, term=2),
    ]
    records[2].record.destroyed = True
    reports = {
        1: NodeReport.of(1.0, [status("a", 3), status("r", 7, FOLLOWER), status("gone", 2)]),
        3: NodeReport.of(1.0, [status("r", 6, FOLLOWER), status("x", 1)]),
    }
    plan = round_of(records, memory=Memory(reports=reports))
    assert sorted(kinds(plan)) == [
        ("rejoin", "r", (3,)),  # node 3 is a member: after the removal it follows again
        ("remove", "a", 3, 1),
        ("remove", "gone", 2, 1),
        ("remove", "r", 6, 3),
        ("remove", "x", 1, 3),
    ]
    assert len(plan.assign) == 1 and len(plan.fence) == 4
    # A round over what node 3's probe flagged removes "x" too, though it has no record
    # (a PChannel deleted in Kubernetes leaves the coord's view): it stayed a full
    # rebalance interval on the node when only recorded names were looked at.
    assert kinds(round_of(records, memory=Memory(reports=reports), dirty={"x"})) == [
        ("remove", "x", 1, 3)
    ]


def test_rebalance_moves_from_the_busiest_to_the_idlest_and_only_when_due() -> None:
    records = [single(f"c{i}", node=1) for i in range(4)] + [single("new", sm.UNINITIALIZED)]
    assert round_of(records, alive=(1, 2)).rebalance == ()
    plan = round_of(records, alive=(1, 2), rebalance=True, max_moves=2)
    # "new" is placed on node 2 this round and counted; c3 then c2 move to even 4 + 1.
    assert kinds(plan) == [
        ("reassign", "new", "placement", 2),
        ("reassign", "c3", "rebalance", 2),
    ]
    assert plan.rebalanced


def test_drained_nodes_take_nothing_and_are_emptied_by_rebalance() -> None:
    records = [single("a", node=1), single("b", sm.UNINITIALIZED)]
    plan = round_of(records, alive=(1, 2), drained=(1,), rebalance=True)
    assert kinds(plan) == [("reassign", "b", "placement", 2), ("reassign", "a", "rebalance", 2)]


# ----------------------------------------------------------------- replicated


def leader_report(name: str, term: int, followers: dict[int, int], end: int = 10) -> NodeReport:
    progress = [(n, acked, end - acked) for n, acked in followers.items()]
    return NodeReport.of(50.0, [status(name, term, LEADER, progress)])


def test_replicated_placement_spreads_members_and_leader_counts() -> None:
    records = [replicated(f"r{i}", members=(), state=sm.UNINITIALIZED) for i in range(2)]
    records.append(single("s", node=1))
    plan = round_of(records)
    assert kinds(plan) == [
        ("term", "r0", "placement", (1, 2, 3)),
        ("term", "r1", "placement", (4, 1, 2)),
    ]
    assert plan.leaders == {1: 1}  # the single-replica pchannel counts as led by node 1


REPLICATED_ROUNDS = {
    "leader lost: failover, the lost member replaced by the spare": (
        dict(records=[replicated("r")], alive=(2, 3, 4)),
        [("term", "r", "failover", (4, 2, 3))],
    ),
    "leader lost, no spare: failover keeps the set": (
        dict(records=[replicated("r")], alive=(2, 3)),
        [("term", "r", "failover", (1, 2, 3))],
    ),
    "no majority alive: unavailable, with the reason": (
        dict(records=[replicated("r")], alive=(3, 4)),
        [("unavailable", "r", "no majority of its replicas is alive")],
    ),
    "a half-done term change resumes under a new term": (
        dict(records=[replicated("r", state=sm.ASSIGNING, term=4)]),
        [("term", "r", "resume", (1, 2, 3))],
    ),
    "leader known dead (ports refuse), within the grace: failover at once, set kept": (
        dict(records=[replicated("r")], live=(2, 3, 4), down=(1,)),
        [("term", "r", "failover", (1, 2, 3))],
    ),
    "leader and a follower known dead: no clean failover, the grace decides": (
        dict(records=[replicated("r")], live=(3, 4), down=(1, 2)),
        [],
    ),
    "a follower known dead: nothing before the grace": (
        dict(records=[replicated("r")], live=(1, 3, 4), down=(2,)),
        [],
    ),
    "a follower lost while a spare is live: reconfigured": (
        dict(records=[replicated("r")], alive=(1, 2, 4)),
        [("term", "r", "reconfigure", (1, 2, 4))],
    ),
}


@pytest.mark.parametrize("case", list(REPLICATED_ROUNDS))
def test_replicated_rounds(case: str) -> None:
    given, jobs = REPLICATED_ROUNDS[case]
    assert kinds(round_of(**given)) == jobs


def test_a_member_probed_without_its_role_rejoins() -> None:
    record = replicated("r", term=5)
    reports = {
        1: NodeReport.of(9.0, [status("r", 5, LEADER)]),
        2: NodeReport.of(9.0, [status("r", 5, FOLLOWER)]),
        3: NodeReport.of(9.0, []),  # restarted: serves nothing yet
    }
    memory = Memory(reports=reports, assigned_at={"r": 8.0})
    assert kinds(round_of([record], memory=memory)) == [("rejoin", "r", (3,))]
    memory.rejoined_at[("r", 3)] = 9.5  # assigned after that probe: wait for the next one
    assert kinds(round_of([record], memory=memory)) == []


def test_drained_leader_hands_over_once_a_follower_is_caught_up() -> None:
    record = replicated("r", term=2)
    behind = Memory(reports={1: leader_report("r", 2, {2: 7, 3: 8})})
    assert kinds(round_of([record], drained=(1,), memory=behind, alive=(1, 2, 3))) == []
    level = Memory(reports={1: leader_report("r", 2, {2: 10, 3: 8})})
    plan = round_of([record], drained=(1,), memory=level, alive=(1, 2, 3))
    assert kinds(plan) == [("term", "r", "handover", (1, 2, 3))]
    level.handover_after["r"] = 200.0  # the last handover kept the leader: back off
    assert kinds(round_of([record], drained=(1,), memory=level, alive=(1, 2, 3))) == []


def test_joint_quorum_ends_once_every_member_holds_the_change_point() -> None:
    record = replicated("r", members=(1, 2, 4), previous=(1, 2, 3), term=3)
    record.record.joint_until = 10
    short = Memory(reports={1: leader_report("r", 3, {2: 10, 4: 9})})
    assert kinds(round_of([record], memory=short)) == []
    full = Memory(reports={1: leader_report("r", 3, {2: 10, 4: 10})})
    assert kinds(round_of([record], memory=full)) == [("joint-done", "r")]


def test_a_report_that_asks_for_action_wakes_the_reconciler() -> None:
    records = {s.name: s for s in [single("a", node=1, term=2), replicated("r", leader=2)]}
    memory = Memory(assigned_at={"a": 1.0, "r": 1.0})

    held: dict[int, set[str]] = {}
    for name, stored in records.items():
        for n in rs.held_by(stored.record):
            held.setdefault(n, set()).add(name)

    def needs(node: int, served) -> set[str]:
        memory.reports[node] = NodeReport.of(5.0, served)
        snapshot = pl.Snapshot(records, NODES, frozenset(), memory)
        walked = pl.needs_action(node, snapshot)
        # the same answer from the index of the node's pchannels (what the coord passes)
        indexed = pl.needs_action(node, dataclasses.replace(snapshot, held=held))
        assert walked == indexed
        return indexed

    assert needs(1, [status("a", 2), status("r", 1, FOLLOWER)]) == set()
    assert needs(1, [status("r", 1, FOLLOWER)]) == {"a"}  # its own "a" is missing
    assert needs(1, [status("a", 1), status("r", 1, FOLLOWER)]) == {"a"}  # a stale term
    assert needs(2, [status("x", 1)]) == {"r", "x"}  # unknown "x"; "r" led by 2: missing
    assert needs(3, []) == {"r"}  # a replicated member that serves nothing
    assert needs(4, []) == set()


@pytest.mark.parametrize("case", list(ROUNDS) + list(REPLICATED_ROUNDS))
def test_a_round_over_the_changed_pchannels_plans_what_a_full_round_would(case: str) -> None:
    """The coord plans only what changed (planner.plan's dirty): over every pchannel of
    a table it is the full round, and every pchannel given a job stays unsettled (the
    next round looks at it again even when nothing about it changes)."""
    given, _ = {**ROUNDS, **REPLICATED_ROUNDS}[case]
    full = round_of(**given)
    names = {s.name for s in given["records"]}
    assert dataclasses.replace(round_of(**given, dirty=names), unsettled=full.unsettled) == full
    assert {j.name for j in full.assign} <= full.unsettled <= names
    if "rebalance" not in given:  # a dirty round plans nothing outside its set
        assert len(round_of(**given, dirty=set())) == 0


def test_a_round_follows_the_change_not_the_cluster() -> None:
    """2,000 replicated pchannels at rest and one whose leader is lost: the full round
    gives that one its failover and leaves only it unsettled; planning just it (what
    the coord does after the loss) gives the same job."""
    rest = [replicated(f"r{i}", members=(2, 3, 4), leader=2 + i % 3) for i in range(2000)]
    lost = replicated("x", members=(1, 2, 3), leader=1)
    full = round_of([*rest, lost], alive=(2, 3, 4))
    assert kinds(full) == [("term", "x", "failover", (4, 2, 3))]
    assert full.unsettled == {"x"}
    dirty = round_of([*rest, lost], alive=(2, 3, 4), dirty={"x"})
    assert kinds(dirty) == kinds(full) and dirty.unsettled == {"x"}
    # at rest: ASSIGNED on live members, the set full; a suspect member is not
    assert pl.at_rest(rest[0].record, pl.Snapshot({}, NODES, frozenset(), Memory()), OBSERVED)
    suspect = dataclasses.replace(OBSERVED, live=frozenset({2, 3}))
    assert not pl.at_rest(rest[0].record, pl.Snapshot({}, NODES, frozenset(), Memory()), suspect)


OBSERVED = pl.Observations(alive=frozenset(NODES), live=frozenset(NODES))


def test_a_retention_the_members_have_not_taken_is_applied_once_assigned() -> None:
    wanted = pb.RetentionPolicy(max_age_ms=3_600_000)
    changed, same, moving, unset = (
        single("a"),
        single("b", node=2),
        single("c", sm.ASSIGNING, node=2, term=2),
        replicated("r"),
    )
    for stored in (changed, same, moving):
        stored.record.retention.CopyFrom(wanted)
    same.record.applied_retention.CopyFrom(wanted)
    changed.record.applied_retention.CopyFrom(pb.RetentionPolicy(max_age_ms=60_000))
    assert kinds(round_of([changed, same, moving, unset])) == [
        ("reassign", "c", "resume", None),  # its move carries the retention
        ("retention", "a"),
    ]


ZONES = {1: {"disk": "ssd"}, 2: {"disk": "ssd"}, 3: {"disk": "hdd"}, 4: {"disk": "hdd"}}


def test_a_node_selector_places_single_copies_and_moves_them_off_unfit_nodes() -> None:
    new = single("n", sm.UNINITIALIZED)
    new.record.node_selector["disk"] = "hdd"
    moved = single("m", node=1)
    moved.record.node_selector["disk"] = "hdd"
    plan = round_of([new, moved], labels=ZONES)
    assert kinds(plan) == [("reassign", "m", "placement", 3), ("reassign", "n", "placement", 4)]


def test_a_selector_no_live_node_matches_is_unschedulable_and_said_once() -> None:
    stored = single("a", node=1)
    stored.record.node_selector["disk"] = "nvme"
    why = "placement.nodeSelector {disk=nvme} matches 0 of 4 live streaming nodes; 1 needed"
    assert kinds(round_of([stored], labels=ZONES)) == [("unschedulable", "a", why)]
    said = Memory(unschedulable={"a": why})
    assert kinds(round_of([stored], labels=ZONES, memory=said)) == []
    stored.record.node_selector["disk"] = "ssd"  # fixed: said again, as cleared
    assert kinds(round_of([stored], labels=ZONES, memory=said)) == [("unschedulable", "a", "")]


def test_replicas_follow_the_selector_and_required_anti_affinity() -> None:
    r = replicated("r", members=(1, 2, 3), leader=1)
    r.record.node_selector["disk"] = "hdd"  # only 3 and 4: 2 of 3 wanted, a majority
    # node 4 replaces node 2 (a follower); leader 1 is unfit too: the next round hands over
    assert kinds(round_of([r], labels=ZONES))[0] == ("term", "r", "reconfigure", (1, 4, 3))
    p = replicated("p", members=(), leader=1, state=sm.UNINITIALIZED)
    p.record.replicas = 3
    one_host = {1: "host-a", 2: "host-a", 3: "host-a", 4: "host-b"}
    why = "placement.antiAffinity Required: 4 eligible nodes span 2 topology domains; 2 needed"
    assert kinds(round_of([p], domains=one_host))[0] == ("term", "p", "placement", (1, 4))
    assert why not in str(kinds(round_of([p], domains=one_host)))
    p.record.anti_affinity = "Preferred"
    assert kinds(round_of([p], domains=one_host))[0] == ("term", "p", "placement", (1, 4, 2))
    all_one = dict.fromkeys(NODES, "host-a")
    p.record.anti_affinity = ""  # Required
    assert kinds(round_of([p], domains=all_one)) == [
        (
            "unschedulable",
            "p",
            "placement.antiAffinity Required: 4 eligible nodes span 1 topology domains; 2 needed",
        )
    ]


def test_a_clock_is_judged_off_only_when_its_probe_proves_it() -> None:
    """The offset is known within half the probe's round trip; an unsure probe keeps the
    last verdict (a loaded loop made one host's nodes look 1.3 s off, issue 24)."""
    bound = 0.5
    assert not pl.clock_skewed(0.1, 0.01, bound, was=False)
    assert pl.clock_skewed(2.0, 0.1, bound, was=False)  # surely off
    assert not pl.clock_skewed(-1.3, 1.4, bound, was=False)  # a 2.8 s round trip: unsure
    assert pl.clock_skewed(-1.3, 1.4, bound, was=True)  # ... either way
    assert not pl.clock_skewed(0.3, 0.1, bound, was=True)  # surely back within the bound
