"""Pure placement planning: how many owners an adapter needs, which replicas they are (rendezvous), at which
tier, and the load/unload changes that take the current placements to the desired ones.

GPU tier: an adapter with at least gpu_tokens_per_s of traffic wants one GPU copy per replica's worth of its
tokens/s, on its highest-ranked owners; its other owners hold it in RAM. Each replica takes those requests
hottest first (tokens/s per copy) into at most gpu_slot_fraction of its GPU slots; the rest are placed in
RAM, and the rest of its slots belong to the replica's LRU. A placement tier is a load target, not a pin:
the replica loads a `gpu` placement into a slot now, and a `ram` one does not evict it from a slot.
Why a share and not every owner: the router prefers the owner that already holds an adapter in GPU, so a
GPU copy on every owner of every warm adapter is mostly unused, and each such load evicts an adapter LRU
would have kept.

Retired versions: a version an alias moved away from, that no alias points at any more, wants no owners, so
the diff unloads it everywhere (the replica drains its running requests first). A rollback makes it aliased
again, so it is no longer retired and is placed (loaded) again. A ready version that was never aliased is
placed as before: a deploy may be about to point an alias at it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from schemas.events import ResidentTier
from schemas.rendezvous import ranked

Placements = dict[str, dict[str, ResidentTier]]  # adapter_id -> {replica_id: tier}


@dataclass(frozen=True)
class Policy:
    default_owners: int = 2
    replica_capacity_tokens_per_s: float = 640.0
    gpu_tokens_per_s: float = 10.0  # an adapter with less traffic is never asked into GPU slots
    gpu_slot_fraction: float = 0.25  # of each replica's GPU slots, the most its gpu placements take
    # hysteresis: an adapter gives up an owner only once the rest would run at most this share of capacity
    shrink_utilization: float = 0.75


@dataclass(frozen=True)
class Change:
    """One command for one replica: load (own it, at tier) or unload (no longer own it)."""

    adapter_id: str
    replica_id: str
    command: Literal["load", "unload"]
    tier: ResidentTier  # the target tier of a load (ram | gpu); the tier held before an unload


def owner_count(tokens_per_s: float, fleet_size: int, policy: Policy, current: int = 0) -> int:
    """k = default, raised to cover the traffic at one replica's capacity, capped by the fleet.

    With `current` owners, k grows as soon as the traffic needs more, but falls only to as many as keep
    each owner at most shrink_utilization of capacity: traffic that hovers at a boundary (630 <-> 650
    tok/s) keeps its owners instead of loading and unloading one every window."""
    cap = policy.replica_capacity_tokens_per_s
    needed = math.ceil(tokens_per_s / cap) if tokens_per_s > 0 else 0
    if needed < current:
        needed = min(current, math.ceil(tokens_per_s / (cap * policy.shrink_utilization)))
    return max(0, min(fleet_size, max(policy.default_owners, needed)))


def gpu_copies(tokens_per_s: float, policy: Policy) -> int:
    """GPU copies an adapter's traffic needs: one per replica's worth of tokens/s."""
    return max(1, math.ceil(tokens_per_s / policy.replica_capacity_tokens_per_s))


def wants_gpu(tokens_per_s: float, policy: Policy) -> bool:
    """Whether an adapter's traffic makes it a candidate for GPU slots."""
    return tokens_per_s > 0 and tokens_per_s >= policy.gpu_tokens_per_s


def gpu_budget(slots: int, policy: Policy) -> int:
    """How many of a replica's GPU slots its gpu placements may take."""
    return math.floor(max(slots, 0) * policy.gpu_slot_fraction)


@lru_cache(maxsize=65536)
def _ranked(adapter_id: str, replicas: tuple[str, ...]) -> tuple[str, ...]:
    # a replan ranks thousands of adapters over an unchanged fleet: hash each pair once per fleet
    return tuple(ranked(adapter_id, replicas))


def desired(
    demand: Mapping[str, float],
    replicas: list[str],
    policy: Policy,
    retired: frozenset[str] = frozenset(),
    gpu_slots: Mapping[str, int] | None = None,
    current: Placements | None = None,
) -> Placements:
    """adapter_id -> {owner: tier} for each adapter in demand (tokens/s; 0 when idle); a retired one: none.

    current: the placements now, whose owner counts the hysteresis of owner_count keeps.

    gpu_slots: replica -> its GPU slots (a replica not in it has none). Each replica's gpu placements are
    chosen among the adapters in demand, so demand must hold every adapter with traffic, not only the ones
    being re-planned: a rising adapter can push another out of a replica's GPU share.
    """
    fleet = tuple(sorted(set(replicas)))
    owned: dict[str, tuple[str, ...]] = {}
    candidates: dict[str, list[tuple[float, str]]] = defaultdict(list)  # replica -> (-tokens/s per owner, id)
    for adapter_id, tps in demand.items():
        if adapter_id in retired:
            owned[adapter_id] = ()
            continue
        k = owner_count(tps, len(fleet), policy, len((current or {}).get(adapter_id, ())))
        owned[adapter_id] = _ranked(adapter_id, fleet)[:k]
        if k and wants_gpu(tps, policy):
            copies = min(k, gpu_copies(tps, policy))
            for replica_id in owned[adapter_id][:copies]:
                candidates[replica_id].append((-tps / copies, adapter_id))
    slots = gpu_slots or {}
    gpu: set[tuple[str, str]] = set()
    for replica_id, ranked_here in candidates.items():
        budget = gpu_budget(slots.get(replica_id, 0), policy)
        gpu.update((adapter_id, replica_id) for _, adapter_id in sorted(ranked_here)[:budget])
    return {
        adapter_id: {r: "gpu" if (adapter_id, r) in gpu else "ram" for r in owners_}
        for adapter_id, owners_ in owned.items()
    }


def touches_gpu_share(demand: Mapping[str, float], current: Placements, policy: Policy) -> bool:
    """Whether planning just these adapters could move a replica's GPU share: one has GPU-worthy traffic
    or holds a gpu placement it may lose. If not, they plan alone (all in RAM) without the full ranking."""
    return any(wants_gpu(tps, policy) for tps in demand.values()) or any(
        "gpu" in tiers.values() for tiers in current.values()
    )


def diff(current: Placements, target: Placements) -> list[Change]:
    """The changes, in a stable order, that turn current into target for the adapters in target."""
    changes: list[Change] = []
    for adapter_id in sorted(target):
        have, want = current.get(adapter_id, {}), target[adapter_id]
        for replica_id in sorted(want):
            if have.get(replica_id) != want[replica_id]:
                changes.append(Change(adapter_id, replica_id, "load", want[replica_id]))
        for replica_id in sorted(set(have) - set(want)):
            changes.append(Change(adapter_id, replica_id, "unload", have[replica_id]))
    return changes


def resend_owned(target: Placements, joiners: list[str], changes: list[Change]) -> list[Change]:
    """A load for every placement of a joining replica that this replan does not already send: a replica
    that restarted under its id owns them still, but holds none of them."""
    sent = {(c.adapter_id, c.replica_id) for c in changes}
    wanted = set(joiners)
    return [
        Change(adapter_id, replica_id, "load", tier)
        for adapter_id, want in sorted(target.items())
        for replica_id, tier in sorted(want.items())
        if replica_id in wanted and (adapter_id, replica_id) not in sent
    ]


def prewarm_targets(adapter_id: str, owner_ids: list[str], takes_over: bool) -> list[str]:
    """The owners that bring an adapter into GPU slots when an alias moves to it.

    Every owner when it takes over a previous version's traffic (a deploy or a rollback to a version not
    serving already: requests arrive at once). Otherwise only its home, the first owner by rendezvous: the
    router sends its requests to the owner that holds it in GPU, so one copy serves a new alias, and a bulk
    registration leaves each replica's slots holding its own homes instead of the last adapters
    registered. A version already serving keeps the copies its traffic gave it."""
    order = ranked(adapter_id, owner_ids)
    return order if takes_over else order[:1]
