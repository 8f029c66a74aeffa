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

    A stall silences replicas within about one report period of each other, and each passes the TTL on its
    own schedule; judged one at a time they would leave one by one. So when a member passes the TTL, the
    guard counts the members quiet for over quiet_share of the TTL with it. If those are more than max_share
    of the last accepted members, and at least two, it freezes them as the held set: each stays a member,
    silent or not, for up to hold_s from then. A held replica that reports again is simply back; one that
    says it is draining leaves. Once none is silent the hold ends; when hold_s runs out, the silent ones leave
    together. Outside a hold, and for a member that goes silent alone, the TTL decides as before."""

    max_share: float = 0.34
    hold_s: float = 30.0
    quiet_share: float = 0.5  # of the TTL: quiet this long counts with a member past it
    accepted: frozenset[str] = field(default_factory=frozenset)  # the members at the last look not held
    held: frozenset[str] = field(default_factory=frozenset)  # frozen when a hold starts
    held_since: float | None = None  # when the hold started

    def members(self, heartbeats: list[Heartbeat], now: float, ttl_s: float, prefix: str = "") -> list[str]:
        """Sorted ids of the members at time now, the held ones kept as described."""
        fresh = members(heartbeats, now, ttl_s, prefix)
        if self.held_since is not None:
            still = self._silent(heartbeats, now, ttl_s, self.held)
            if still and now - self.held_since < self.hold_s:
                return sorted(set(fresh) | still)
            self.held, self.held_since = frozenset(), None  # all back, or the hold ran out: they leave
        else:
            quiet = self._silent(heartbeats, now, self.quiet_share * ttl_s, self.accepted)
            past_ttl = self._silent(heartbeats, now, ttl_s, quiet)
            many = len(quiet) >= 2 and len(quiet) > self.max_share * len(self.accepted)
            if past_ttl and many and self.hold_s > 0:
                self.held, self.held_since = frozenset(quiet), now
                return sorted(set(fresh) | past_ttl)
        self.accepted = frozenset(fresh)
        return fresh

    def holding(self, heartbeats: list[Heartbeat], now: float, ttl_s: float) -> set[str]:
        """The held members past the TTL at time now (none outside a hold)."""
        if self.held_since is None:
            return set()
        return self._silent(heartbeats, now, ttl_s, self.held)

    @staticmethod
    def _silent(
        heartbeats: list[Heartbeat], now: float, after_s: float, among: frozenset[str] | set[str]
    ) -> set[str]:
        """The replicas among `among` not heard from for over after_s that still report an owning status."""
        return {
            h.replica_id
            for h in heartbeats
            if h.replica_id in among and h.status in OWNING_STATUSES and now - h.last_seen > after_s
        }
