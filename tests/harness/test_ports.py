"""Ports handed out for stack processes: free, outside the ephemeral range, never twice in one run."""

from __future__ import annotations

import socket

from harness import ports


def test_a_block_of_ports_is_free_outside_the_ephemeral_range_and_not_handed_out_again() -> None:
    low, high = ports.ephemeral_range()
    first = ports.free_ports(6)
    block = set(range(first, first + 6))
    assert all(p >= ports.LOWEST and not low <= p <= high for p in block)
    for p in block:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    singles = {ports.free_port() for _ in range(50)}
    assert len(singles) == 50 and not singles & block


def test_a_port_someone_listens_on_is_not_bindable() -> None:
    port = ports.free_port()
    assert ports._bindable(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not ports._bindable(port)
