"""Fleet membership from replica.state heartbeats: a replica is a member (it may own adapters) while it
reports `warming` or `ready` and was seen within the TTL. A warming replica owns adapters so that it loads
them before the router sends it anything; a draining one owns none, so its adapters move before it exits.
Pure: times are passed in.

Many members silent at once are more likely a stall on the way (the broker, the network, a starved host)
than that many deaths: SilenceGuard keeps them for a while before the fleet is replanned without them, as
Eureka's self-preservation and Kubernetes' unhealthy-zone rule do. One replica that dies leaves at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class SilenceGuard:
    """Membership that holds on to members gone silent together.

    When more than max_share of the last accepted members (and at least two) passed the TTL while still
    reporting an owning status, they stay members for up to hold_s from the moment that was first seen. If
    they report again meanwhile nothing moved; if not, the fleet is replanned without them after hold_s. A
    replica that said it is draining or gone is never held."""

    max_share: float = 0.34
    hold_s: float = 30.0
    accepted: frozenset[str] = field(default_factory=frozenset)  # the members at the last look not held
    held_since: float | None = None  # when the silent members were first held

    def members(self, heartbeats: list[Heartbeat], now: float, ttl_s: float, prefix: str = "") -> list[str]:
        """Sorted ids of the members at time now, the silent ones held as described."""
        fresh = members(heartbeats, now, ttl_s, prefix)
        silent = self.silent(heartbeats, now, ttl_s)
        if len(silent) >= 2 and len(silent) > self.max_share * len(self.accepted):
            if self.held_since is None:
                self.held_since = now
            if now - self.held_since < self.hold_s:
                return sorted(set(fresh) | silent)
        self.held_since = None
        self.accepted = frozenset(fresh)
        return fresh

    def silent(self, heartbeats: list[Heartbeat], now: float, ttl_s: float) -> set[str]:
        """The accepted members past the TTL that still report an owning status."""
        return {
            h.replica_id
            for h in heartbeats
            if h.replica_id in self.accepted and h.status in OWNING_STATUSES and now - h.last_seen > ttl_s
        }
