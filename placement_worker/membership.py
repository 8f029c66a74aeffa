"""Fleet membership from replica.state heartbeats: a replica is a member (it may own adapters) while it
reports `warming` or `ready` and was seen within the TTL. A warming replica owns adapters so that it loads
them before the router sends it anything; a draining one owns none, so its adapters move before it exits.
Pure: times are passed in."""

from __future__ import annotations

from dataclasses import dataclass

OWNING_STATUSES = frozenset({"warming", "ready"})


@dataclass(frozen=True)
class Heartbeat:
    replica_id: str
    status: str  # starting | warming | ready | draining | gone
    last_seen: float  # seconds since the epoch
    gpu_slots: int = 0  # adapter slots it reported (replica.state)
    # warming, and no full replan has counted it in since its warming began: it waits for its owned set
    joining: bool = False


def members(heartbeats: list[Heartbeat], now: float, ttl_s: float, prefix: str = "") -> list[str]:
    """Sorted ids of the replicas that may own adapters at time now."""
    return sorted(
        h.replica_id
        for h in heartbeats
        if h.status in OWNING_STATUSES and now - h.last_seen <= ttl_s and h.replica_id.startswith(prefix)
    )


def joining(heartbeats: list[Heartbeat], member_ids: list[str]) -> list[str]:
    """Sorted ids of the members that wait for a full replan to learn what they own."""
    current = set(member_ids)
    return sorted(h.replica_id for h in heartbeats if h.joining and h.replica_id in current)
