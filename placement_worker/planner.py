"""Pure placement planning: how many owners an adapter needs, which replicas they are (rendezvous), at which
tier, and the load/unload changes that take the current placements to the desired ones.

Retired versions: a version an alias moved away from, that no alias points at any more, wants no owners, so
the diff unloads it everywhere (the replica drains its running requests first). A rollback makes it aliased
again, so it is no longer retired and is placed (loaded) again. A ready version that was never aliased is
placed as before: a deploy may be about to point an alias at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.rendezvous import owners

Placements = dict[str, dict[str, str]]  # adapter_id -> {replica_id: tier}


@dataclass(frozen=True)
class Policy:
    default_owners: int = 2
    replica_capacity_tokens_per_s: float = 640.0
    gpu_tokens_per_s: float = 1.0


@dataclass(frozen=True)
class Change:
    """One command for one replica: load (own it, at tier) or unload (no longer own it)."""

    adapter_id: str
    replica_id: str
    command: str  # load | unload
    tier: str  # ram | gpu (the target tier of a load; the tier held before an unload)


def owner_count(tokens_per_s: float, fleet_size: int, policy: Policy) -> int:
    """k = default, raised to cover the traffic at one replica's capacity, capped by the fleet."""
    needed = math.ceil(tokens_per_s / policy.replica_capacity_tokens_per_s) if tokens_per_s > 0 else 0
    return max(0, min(fleet_size, max(policy.default_owners, needed)))


def tier_for(tokens_per_s: float, policy: Policy) -> str:
    return "gpu" if tokens_per_s >= policy.gpu_tokens_per_s and tokens_per_s > 0 else "ram"


def desired(
    demand: dict[str, float], replicas: list[str], policy: Policy, retired: frozenset[str] = frozenset()
) -> Placements:
    """adapter_id -> {owner: tier} for each adapter in demand (tokens/s; 0 when idle); a retired one: none."""
    out: Placements = {}
    for adapter_id, tps in demand.items():
        if adapter_id in retired:
            out[adapter_id] = {}
            continue
        k = owner_count(tps, len(replicas), policy)
        tier = tier_for(tps, policy)
        out[adapter_id] = {r: tier for r in owners(adapter_id, replicas, k)} if k else {}
    return out


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
