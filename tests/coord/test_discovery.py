"""AssignmentHub: versions only move on real changes, every change reaches every subscriber."""

from __future__ import annotations

from streamwal.coord import discovery
from streamwal.coord import state_machine as sm

A = sm.NodeRef(1, "127.0.0.1:1")
B = sm.NodeRef(2, "127.0.0.1:2")


def assigned(name: str, *targets: sm.NodeRef):
    meta = sm.new_channel(name)
    for target in targets:
        meta = sm.finish_assignment(sm.begin_assignment(meta, target))
    return meta


def version(response) -> tuple[int, int]:
    v = response.full_assignment.version
    return getattr(v, "global"), v.local


def test_only_assigned_channels_are_published_grouped_by_node():
    hub = discovery.AssignmentHub(incarnation=7)
    assigning = sm.begin_assignment(sm.new_channel("c"), A)
    assert hub.update([assigned("a", A), assigned("b", B), assigning, sm.new_channel("d")])
    full = hub.current.full_assignment
    assert version(hub.current) == (7, 1)
    assert [(a.node.server_id, [c.name for c in a.channels]) for a in full.assignments] == [
        (1, ["a"]),
        (2, ["b"]),
    ]


def test_every_change_in_order_and_no_version_without_change():
    hub = discovery.AssignmentHub(incarnation=3)
    queue = hub.subscribe()
    hub.update([assigned("a", A)])
    assert not hub.update([assigned("a", A)])  # same view: no new version
    hub.update([assigned("a", A, B)])
    hub.update([assigned("a", A, B), assigned("b", A)])
    seen = []
    while not queue.empty():
        seen.append(queue.get_nowait())
    assert [version(r) for r in seen] == [(3, 0), (3, 1), (3, 2), (3, 3)]
    assert [(c.name, c.term) for a in seen[2].full_assignment.assignments for c in a.channels] == [
        ("a", 2)
    ]
    hub.unsubscribe(queue)
    hub.update([])
    assert queue.empty()


def test_close_all_ends_every_stream():
    hub = discovery.AssignmentHub(incarnation=1)
    q1, q2 = hub.subscribe(), hub.subscribe()
    hub.close_all()
    for q in (q1, q2):
        q.get_nowait()
        assert q.get_nowait() is None
