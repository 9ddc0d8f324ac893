"""The test harness's node: a port taken before the node binds it is picked again (tests
run side by side; CI runs lost tests to that race), and picks stay below the kernel's
ephemeral range, which outgoing connections draw from."""

from __future__ import annotations

import socket

import pytest

import streamwal.testing.local_node as local_node


@pytest.mark.parametrize("taken_pick", [0, 1], ids=["listen", "internal"])
def test_a_port_taken_first_is_picked_again(tmp_path, monkeypatch, taken_pick: int) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks: list[int] = []
        real = local_node.free_port

        def one_taken(host: str = "127.0.0.1") -> int:
            picks.append(busy if len(picks) == taken_pick else real(host))
            return picks[-1]

        monkeypatch.setattr(local_node, "free_port", one_taken)
        node = local_node.LocalNode(tmp_path / "n1").start()
        try:
            assert picks[taken_pick] == busy and busy not in (node.port, node.internal_port)
            assert "Address already in use" in node.log_tail()  # the first try said why
        finally:
            node.kill()


def test_picked_ports_are_below_the_ephemeral_range() -> None:
    low = local_node._ephemeral_low()
    assert all(10000 <= local_node.free_port() < low for _ in range(20))
