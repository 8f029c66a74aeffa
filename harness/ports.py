"""Listening ports for the servers that benchmark and test stacks start in other processes.

Binding port 0 and closing the socket hands out a port from the kernel's ephemeral range, which every
outgoing connection (the Kafka, PostgreSQL and HTTP clients open many) also draws from, so another socket
can take it before the server binds. These ports lie outside that range and above every fixed port the
stack uses, are drawn from the OS's randomness (a seeded `random` in one test run repeats another's), are
never handed out twice in one run, and are free when handed out.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20_000  # above the stack's fixed ports (8100, 9460-9466, 15432, 18080-18199, 19000-19093)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_draw = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections (Linux's default when it cannot be read)."""
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are each free as free_port's are; all marked handed out."""
    low, high = ephemeral_range()
    usable = [not low <= p <= high and p not in _handed_out for p in range(65536)]
    candidates = [p for p in range(LOWEST, 65536 - count + 1) if all(usable[p : p + count])]
    for first in _draw.sample(candidates, min(200, len(candidates))):
        block = range(first, first + count)
        if all(_bindable(p) for p in block):
            _handed_out.update(block)
            return first
    raise RuntimeError(f"no {count} consecutive free ports outside the ephemeral range {low}-{high}")


def free_port() -> int:
    """A port no one listens on now, outside the ephemeral range, not handed out before in this run."""
    return free_ports(1)
