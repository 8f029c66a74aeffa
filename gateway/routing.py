"""Router policy, pure: which replicas to try for an adapter, in order.

Affinity (the default): the adapter's owners are the top-k of schemas.rendezvous over the live replicas,
the same function the placement worker uses; replicas that report the adapter resident (extra owners the
placement worker added for a hot adapter, or spills) join them. The least-loaded of those goes first,
unless one that already holds the adapter in a GPU slot is at most gpu_preference_tokens busier: then that
one goes first, so a hot adapter does not take a slot on every owner. When the chosen replica is over the
spill threshold, the least-loaded live replica goes first instead. The rest follow in load order, so a
connection failure before the first byte retries on the next one.
Random: a uniformly random live replica first (the A/B baseline).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schemas.rendezvous import owners


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows of one live replica."""

    replica_id: str
    url: str
    tokens_in_flight: int
    resident: frozenset[str] = field(default_factory=frozenset)  # adapter ids in GPU or RAM
    gpu: frozenset[str] = field(default_factory=frozenset)
    merged: str | None = None  # a merged replica serves only this adapter (gateway/merged_routing.py)


@dataclass(frozen=True)
class RoutePlan:
    """Replicas to try in order, and why the first was chosen (owner | spill | random)."""

    replicas: tuple[ReplicaLoad, ...]
    reason: str


@dataclass(frozen=True)
class RouterPolicy:
    owners_k: int = 2
    # About one full batch of the brief's requests (32 x (750 + 250) tokens); below it an owner has room.
    spill_threshold_tokens: int = 32_000
    gpu_preference_tokens: int = 8_000


def _load_order(replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    return sorted(replicas, key=lambda r: (r.tokens_in_flight, r.replica_id))


def route_affinity(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    if not live:
        return RoutePlan((), "none")
    by_id = {r.replica_id: r for r in live}
    owner_ids = set(owners(adapter_id, by_id, policy.owners_k))
    owner_ids |= {r.replica_id for r in live if adapter_id in r.resident}
    candidates = _load_order([by_id[i] for i in owner_ids])
    warm = [r for r in candidates if adapter_id in r.gpu]
    if warm and warm[0].tokens_in_flight <= candidates[0].tokens_in_flight + policy.gpu_preference_tokens:
        candidates.remove(warm[0])
        candidates.insert(0, warm[0])
    rest = _load_order([r for r in live if r.replica_id not in owner_ids])
    best = candidates[0]
    if (
        best.tokens_in_flight > policy.spill_threshold_tokens
        and rest
        and (rest[0].tokens_in_flight < best.tokens_in_flight)
    ):
        return RoutePlan((rest[0], *candidates, *rest[1:]), "spill")
    return RoutePlan((*candidates, *rest), "owner")


def route_random(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    if not live:
        return RoutePlan((), "none")
    first = rng.choice(list(live))
    return RoutePlan((first, *_load_order([r for r in live if r is not first])), "random")


ROUTING_MODES: dict[str, Callable[[str, Sequence[ReplicaLoad], RouterPolicy, random.Random], RoutePlan]] = {
    "affinity": route_affinity,
    "random": route_random,
}
