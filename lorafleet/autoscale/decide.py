"""What `lorafleet autoscale --local` does with one autoscale signal: pure, on plain values.

The fleet is the replicas this autoscaler did not start (the stack's replica-0 and replica-1) plus the ones it
did (replica-2, replica-3, ... on consecutive ports). It starts the lowest free indices and stops the highest
one it started, never a replica it did not start, and never takes the fleet below the minimum.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The local fleet's shape."""

    min_replicas: int = 2
    max_replicas: int = 4
    unmanaged_replicas: int = 2  # replica-0 .. replica-(n-1), started by `lorafleet services up`
    first_port: int = 18100  # replica-k listens on first_port + k


@dataclass(frozen=True)
class Start:
    index: int
    replica_id: str
    port: int


@dataclass(frozen=True)
class Stop:
    index: int
    replica_id: str
    pid: int


def replica_id(index: int) -> str:
    return f"replica-{index}"


def decide(managed: dict[int, int], desired: int, limits: Limits) -> list[Start | Stop]:
    """Actions that bring the fleet to `desired` (clamped); managed maps our replicas' index to pid."""
    target = max(limits.min_replicas, limits.unmanaged_replicas, min(desired, limits.max_replicas))
    total = limits.unmanaged_replicas + len(managed)
    if target > total:
        free = (i for i in range(limits.unmanaged_replicas, 10_000) if i not in managed)
        return [
            Start(i, replica_id(i), limits.first_port + i)
            for i, _ in zip(free, range(target - total), strict=False)
        ]
    ours = sorted(managed, reverse=True)[: total - target]
    return [Stop(i, replica_id(i), managed[i]) for i in ours]
