"""Router policy, pure: which replicas to try for an adapter, in order (the modes: docs/routing.md)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from schemas.rendezvous import owners
from schemas.tiers import LOAD_S


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows of one live replica."""

    replica_id: str
    url: str
    tokens_in_flight: int
    resident: frozenset[str] = field(default_factory=frozenset)  # adapter ids in GPU or RAM
    gpu: frozenset[str] = field(default_factory=frozenset)
    merged: str | None = (
        None  # a merged replica serves only this adapter (gateway/public/routing/merged_first.py)
    )
    gpu_slots: int = 0  # the GPU slots its state reports (0: unknown)
    # its batch as reported, plus what this gateway sent since: rows in use, requests waiting for one, the
    # batch's size (0: not reported), prompt tokens not yet prefilled
    running: int = 0
    waiting: int = 0
    max_running: int = 0
    prefill_tokens: int = 0


@dataclass(frozen=True)
class RoutePlan:
    """Replicas to try in order, and why the first was chosen (owner | spill | random)."""

    replicas: tuple[ReplicaLoad, ...]
    reason: str


@dataclass(frozen=True)
class RouterPolicy:
    owners_k: int = 2
    # For a replica that reports no batch: about one full batch of the brief's requests (32 x (750 + 250)
    # tokens); at most this in flight, an owner has room (has_room).
    spill_threshold_tokens: int = 32_000
    gpu_preference_tokens: int = 8_000
    # cost routing: a full batch of the brief's requests (32 x 1,000 tokens) drains in about 12.5 s
    drain_tokens_per_s: float = 2_560.0
    # the price of the slot a GPU load takes, in seconds of queue (3 s: about 7,700 tokens in flight)
    slot_cost_s: float = 3.0
    load_s: Mapping[str, float] = field(default_factory=lambda: dict(LOAD_S))  # tier -> seconds
    # An owner that reports its batch is overloaded when a new request would wait longer than spill_wait_s
    # to start: the prompts ahead of it at prefill_tokens_per_s, and a row_wait_s per request short of a
    # free row (the brief's batch of 32 answers of 250 tokens at 50 ms a step frees a row every 0.4 s).
    spill_wait_s: float = 1.0
    prefill_tokens_per_s: float = 8_000.0
    row_wait_s: float = 0.4


def _load_order(replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    return sorted(replicas, key=lambda r: (r.tokens_in_flight, r.replica_id))


def wait_s(replica: ReplicaLoad, policy: RouterPolicy) -> float | None:
    """Seconds a new request would wait on the replica before the step that prefills it: the prompts ahead
    of it, and the rows that must free first when every row is taken. None when it reports no batch."""
    if replica.max_running <= 0:
        return None
    short = max(replica.running + replica.waiting + 1 - replica.max_running, 0)
    return replica.prefill_tokens / policy.prefill_tokens_per_s + short * policy.row_wait_s


def has_room(replica: ReplicaLoad, policy: RouterPolicy) -> bool:
    """An owner that can take the request without a spill: one whose new request would start within
    spill_wait_s, or, where the replica reports no batch, one with at most the spill threshold in flight.
    Tokens in flight count the prompts and answers of requests already running, which a new request does
    not wait for while the batch has a free row."""
    wait = wait_s(replica, policy)
    if wait is None:
        return replica.tokens_in_flight <= policy.spill_threshold_tokens
    return wait <= policy.spill_wait_s


def _busier(a: ReplicaLoad, b: ReplicaLoad, policy: RouterPolicy) -> bool:
    """a would make a new request wait longer than b (tokens in flight where either reports no batch)."""
    wa, wb = wait_s(a, policy), wait_s(b, policy)
    if wa is None or wb is None:
        return a.tokens_in_flight > b.tokens_in_flight
    return wa > wb


def _gpu_first(adapter_id: str, ranked: list[ReplicaLoad], policy: RouterPolicy) -> list[ReplicaLoad]:
    """Load order, with the least-loaded replica holding the adapter in a GPU slot moved to the front
    while it is at most gpu_preference_tokens busier than the first."""
    warm = [r for r in ranked if adapter_id in r.gpu]
    if warm and warm[0].tokens_in_flight <= ranked[0].tokens_in_flight + policy.gpu_preference_tokens:
        return [warm[0], *(r for r in ranked if r is not warm[0])]
    return ranked


def route_affinity(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    """Owners with room first (GPU preference among them), then the overloaded owners, then the rest;
    spill only when every owner is overloaded."""
    if not live:
        return RoutePlan((), "none")
    by_id = {r.replica_id: r for r in live}
    owner_ids = set(owners(adapter_id, by_id, policy.owners_k))
    owner_ids |= {r.replica_id for r in live if adapter_id in r.resident}
    ranked = _load_order([by_id[i] for i in owner_ids])
    room = [r for r in ranked if has_room(r, policy)]
    full = [r for r in ranked if not has_room(r, policy)]
    rest = _load_order([r for r in live if r.replica_id not in owner_ids])
    if room:
        return RoutePlan((*_gpu_first(adapter_id, room, policy), *full, *rest), "owner")
    candidates = _gpu_first(adapter_id, full, policy)
    if rest and _busier(candidates[0], rest[0], policy):
        return RoutePlan((rest[0], *candidates, *rest[1:]), "spill")
    return RoutePlan((*candidates, *rest), "owner")


def tier_on(adapter_id: str, replica: ReplicaLoad, owner: bool) -> str:
    """Where the adapter is on a replica, as its state report shows it: an owner keeps it on local disk."""
    if adapter_id in replica.gpu:
        return "gpu"
    if adapter_id in replica.resident:
        return "ram"
    return "disk" if owner else "remote"


def expected_cost_s(
    adapter_id: str, replica: ReplicaLoad, home: bool, owner: bool, policy: RouterPolicy
) -> float:
    """Seconds of queue, load and slot price a request for the adapter costs on this replica."""
    tier = tier_on(adapter_id, replica, owner)
    cost = replica.tokens_in_flight / policy.drain_tokens_per_s + policy.load_s.get(tier, 0.0)
    if tier == "gpu":
        return cost
    return cost + policy.slot_cost_s * (1 if home else 2)


def route_cost(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    if not live:
        return RoutePlan((), "none")
    by_id = {r.replica_id: r for r in live}
    ranked_owners = owners(adapter_id, by_id, policy.owners_k)
    order = {rid: i for i, rid in enumerate(ranked_owners)}
    for r in live:
        if adapter_id in r.resident and r.replica_id not in order:
            order[r.replica_id] = len(order)
    home = ranked_owners[0]

    def price(r: ReplicaLoad) -> tuple[float, int, str]:
        owner = r.replica_id in order
        cost = expected_cost_s(adapter_id, r, r.replica_id == home, owner, policy)
        return cost, order.get(r.replica_id, len(order)), r.replica_id

    # owners with room first, each group cheapest first; a spill only when every owner is overloaded
    candidates = sorted((by_id[i] for i in order), key=lambda r: (not has_room(r, policy), price(r)))
    rest = sorted((r for r in live if r.replica_id not in order), key=price)
    best = candidates[0]
    if not has_room(best, policy) and rest and price(rest[0]) < price(best):
        return RoutePlan((rest[0], *candidates, *rest[1:]), "spill")
    return RoutePlan((*candidates, *rest), "owner")


TABLE = {"gpu": 1.0, "free": 0.8, "ram": 0.6}


def table_score(adapter_id: str, replica: ReplicaLoad, least: int, most: int) -> float:
    """The fixed table's LoRA score plus the queue score, normalised over the fleet's least..most load."""
    if adapter_id in replica.gpu:
        lora = TABLE["gpu"]
    elif len(replica.gpu) < replica.gpu_slots:
        lora = TABLE["free"]
    else:
        lora = TABLE["ram"] if adapter_id in replica.resident else 0.0
    queue = 1.0 if most == least else (most - replica.tokens_in_flight) / (most - least)
    return lora + queue


def route_table(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    if not live:
        return RoutePlan((), "none")
    loads = [r.tokens_in_flight for r in live]
    least, most = min(loads), max(loads)
    ties = {r.replica_id: rng.random() for r in live}
    order = sorted(live, key=lambda r: (-table_score(adapter_id, r, least, most), ties[r.replica_id]))
    return RoutePlan(tuple(order), "table")


def route_random(
    adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
) -> RoutePlan:
    if not live:
        return RoutePlan((), "none")
    first = rng.choice(list(live))
    return RoutePlan((first, *_load_order([r for r in live if r is not first])), "random")


ROUTING_MODES: dict[str, Callable[[str, Sequence[ReplicaLoad], RouterPolicy, random.Random], RoutePlan]] = {
    "affinity": route_affinity,
    "cost": route_cost,
    "table": route_table,
    "random": route_random,
}
