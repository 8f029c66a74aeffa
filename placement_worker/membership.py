"""Fleet membership from replica.state heartbeats: a replica is a member while it reports `ready` and was
seen within the TTL. Pure: times are passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Heartbeat:
    replica_id: str
    status: str  # starting | ready | draining | gone
    last_seen: float  # seconds since the epoch
    gpu_slots: int = 0  # adapter slots it reported (replica.state)


def members(heartbeats: list[Heartbeat], now: float, ttl_s: float, prefix: str = "") -> list[str]:
    """Sorted ids of the replicas that may own adapters at time now."""
    return sorted(
        h.replica_id
        for h in heartbeats
        if h.status == "ready" and now - h.last_seen <= ttl_s and h.replica_id.startswith(prefix)
    )
