"""The test harness's node: an internal port taken before the node binds it is picked
again (tests run side by side; one CI run lost a test to that race)."""

from __future__ import annotations

import socket

import streamwal.testing.local_node as local_node


def test_an_internal_port_taken_first_is_picked_again(tmp_path, monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks: list[int] = []
        real = local_node.free_port

        def first_the_taken_one(host: str = "127.0.0.1") -> int:
            picks.append(busy if not picks else real(host))
            return picks[-1]

        monkeypatch.setattr(local_node, "free_port", first_the_taken_one)
        node = local_node.LocalNode(tmp_path / "n1").start()
        try:
            assert picks[0] == busy and node.internal_port == picks[1] != busy
            assert "Address already in use" in node.log_tail()  # the first try said why
        finally:
            node.kill()
