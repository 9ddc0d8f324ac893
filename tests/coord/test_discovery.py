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


def _routes(responses) -> dict[str, tuple[int, int]]:
    """A client's view after applying `responses` (a full table, then deltas) in order."""
    view: dict[str, tuple[int, int]] = {}
    held = None
    for r in responses:
        if r.HasField("full_assignment"):
            view = {
                c.name: (a.node.server_id, c.term)
                for a in r.full_assignment.assignments
                for c in a.channels
            }
            held = version(r)
        else:
            d = r.delta
            assert (getattr(d.base, "global"), d.base.local) == held  # applies to what we hold
            for name in d.unassigned:
                view.pop(name)
            view.update(
                {c.name: (a.node.server_id, c.term) for a in d.assigned for c in a.channels}
            )
            held = (getattr(d.version, "global"), d.version.local)
    return view


def _drain(queue) -> list:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def test_deltas_carry_only_what_moved_and_seed_clients_keep_full_tables():
    hub = discovery.AssignmentHub(incarnation=5)
    metas = {f"p{i}": assigned(f"p{i}", A) for i in range(100)}
    hub.update(metas.values())
    seed, client = hub.subscribe(), hub.subscribe(deltas=True)
    moved = assigned("p7", A, B)
    hub.change("p7", moved)
    hub.change("p8", None)  # destroyed
    got = _drain(client)
    assert got[0].HasField("full_assignment") and [r.HasField("delta") for r in got[1:]] == [
        True,
        True,
    ]
    assert [(c.name, c.term) for a in got[1].delta.assigned for c in a.channels] == [("p7", 2)]
    assert list(got[2].delta.unassigned) == ["p8"]
    assert got[1].ByteSize() < got[0].ByteSize() / 20  # proportional to what moved
    expected = {n: (1, 1) for n in metas if n != "p8"} | {"p7": (2, 2)}
    assert _routes(got) == expected
    assert [r.WhichOneof("response") for r in _drain(seed)] == ["full_assignment"] * 3


async def test_changes_within_the_interval_go_out_as_one_version():
    import asyncio

    hub = discovery.AssignmentHub(incarnation=2, flush_interval=0.02)
    hub.update([assigned("a", A), assigned("b", A)])
    await asyncio.sleep(0.05)
    client = hub.subscribe(deltas=True)
    for name in ("a", "b"):
        hub.change(name, assigned(name, A, B))
    hub.change("c", assigned("c", B))
    hub.change("c", None)  # came and went within the interval: not published at all
    assert client.qsize() == 1  # nothing yet: coalescing
    await asyncio.sleep(0.05)
    full, delta = _drain(client)
    assert full.HasField("full_assignment")
    assert delta.delta.version.local == delta.delta.base.local + 1
    assert sorted(c.name for a in delta.delta.assigned for c in a.channels) == ["a", "b"]
    assert list(delta.delta.unassigned) == []
    hub.close_all()


def test_a_client_resumes_from_its_version_or_gets_the_table():
    hub = discovery.AssignmentHub(incarnation=4)
    hub.update([assigned("a", A)])
    first = hub.subscribe(deltas=True)
    hub.change("b", assigned("b", A))
    seen = _drain(first)
    held = (4, seen[-1].delta.version.local)
    hub.unsubscribe(first)
    hub.change("a", assigned("a", A, B))  # missed while disconnected
    hub.change("c", assigned("c", B))
    resumed = _drain(hub.subscribe(deltas=True, since=held))
    assert [r.WhichOneof("response") for r in resumed] == ["delta", "delta"]
    assert _routes(seen + resumed) == {"a": (2, 2), "b": (1, 1), "c": (2, 1)}
    # up to date: one empty delta; unknown version or another incarnation: the table
    assert [r.delta.assigned for r in _drain(hub.subscribe(True, (4, hub.local)))] == [[]]
    assert _drain(hub.subscribe(True, (3, 1)))[0].HasField("full_assignment")
    assert _drain(hub.subscribe(True, (4, 99)))[0].HasField("full_assignment")
    assert discovery.parse_version("4.2") == (4, 2) and discovery.parse_version("x") is None
