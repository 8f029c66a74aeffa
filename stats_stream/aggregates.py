"""Per-window aggregates over plain event lists: adapters, tenants, replicas, fleet load, cost.

Every function takes the events of one window (already deduplicated by `dedupe`) and returns plain values.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from schemas.events import Event, ReplicaEvent, ReplicaState, RequestCompleted, Tier

E = TypeVar("E", bound=Event)
TIERS: tuple[Tier, ...] = ("gpu", "ram", "disk", "remote")


def dedupe(events: Iterable[E]) -> list[E]:
    """Keep the first delivery of each event_id: a redelivered event is counted once."""
    seen: set[uuid.UUID] = set()
    out: list[E] = []
    for event in events:
        if event.event_id not in seen:
            seen.add(event.event_id)
            out.append(event)
    return out


@dataclass(frozen=True)
class AdapterWindow:
    adapter_id: str
    requests: int
    completion_tokens: int
    tokens_per_s: float
    gpu_hit_rate: float  # share of all its requests whose adapter was in a GPU slot on arrival
    errors: int = 0  # requests that ended in an error
    p50_ttft_s: float | None = None  # over its successful requests with a measured TTFT; None without one
    p95_ttft_s: float | None = None


def adapter_windows(requests: Iterable[RequestCompleted], window_s: float) -> dict[str, AdapterWindow]:
    """Requests, output tokens/s, GPU hit rate, errors and TTFT per adapter version (so a canary's health
    shows apart from its alias's current version)."""
    count: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    gpu: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    ttfts: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        count[r.adapter_id] += 1
        tokens[r.adapter_id] += r.completion_tokens
        gpu[r.adapter_id] += r.tier == "gpu"
        errors[r.adapter_id] += r.status == "error"
        if r.status == "ok" and r.ttft_s is not None:
            ttfts[r.adapter_id].append(r.ttft_s)
    out = {}
    for a, n in sorted(count.items()):
        t = ttfts.get(a)
        p50, p95 = (percentile(t, 50), percentile(t, 95)) if t else (None, None)
        out[a] = AdapterWindow(a, n, tokens[a], tokens[a] / window_s, gpu[a] / n, errors[a], p50, p95)
    return out


def tier_shares(requests: Sequence[RequestCompleted]) -> dict[str, float]:
    """Fleet-wide share of requests found in each tier (requests without a tier count in none)."""
    if not requests:
        return {t: 0.0 for t in TIERS}
    found = Counter(r.tier for r in requests)
    return {t: found[t] / len(requests) for t in TIERS}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): the smallest value with at least q% of values at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class TenantLatency:
    tenant_id: str
    requests: int  # successful requests with a measured TTFT
    p50_ttft_s: float
    p95_ttft_s: float


def tenant_latencies(requests: Iterable[RequestCompleted]) -> dict[str, TenantLatency]:
    """p50/p95 TTFT per tenant over its successful requests."""
    ttfts: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        if r.status == "ok" and r.ttft_s is not None:
            ttfts[r.tenant_id].append(r.ttft_s)
    return {
        t: TenantLatency(t, len(v), percentile(v, 50), percentile(v, 95)) for t, v in sorted(ttfts.items())
    }


@dataclass(frozen=True)
class ReplicaChurn:
    replica_id: str
    loads: int
    evictions: int
    loads_per_min: float
    evictions_per_min: float


def replica_churn(events: Iterable[ReplicaEvent], window_s: float) -> dict[str, ReplicaChurn]:
    """Loads and evictions per minute per replica."""
    loads: Counter[str] = Counter()
    evictions: Counter[str] = Counter()
    for e in events:
        (loads if e.kind == "load" else evictions)[e.replica_id] += 1
    per_min = 60.0 / window_s
    return {
        r: ReplicaChurn(r, loads[r], evictions[r], loads[r] * per_min, evictions[r] * per_min)
        for r in sorted(set(loads) | set(evictions))
    }


@dataclass(frozen=True)
class FleetLoad:
    serving_replicas: int  # distinct replicas seen starting or ready (not draining)
    billed_replicas: int  # every replica seen, draining included: each holds a GPU
    queue_depth: float  # sum over replicas of the window's mean queue depth
    tokens_in_flight: float  # the same for tokens in flight
    joining_replicas: int = 0  # of the serving ones, those still starting or warming (not yet routed to)


def fleet_load(states: Iterable[ReplicaState]) -> FleetLoad:
    """The fleet's size and load over a window, from the replicas' per-second state."""
    samples: dict[str, list[ReplicaState]] = defaultdict(list)
    for s in states:
        samples[s.replica_id].append(s)
    latest = {r: max(v, key=lambda s: s.occurred_at) for r, v in samples.items()}
    return FleetLoad(
        serving_replicas=sum(1 for s in latest.values() if s.status != "draining"),
        billed_replicas=len(samples),
        queue_depth=sum(sum(s.queue_depth for s in v) / len(v) for v in samples.values()),
        tokens_in_flight=sum(sum(s.tokens_in_flight for s in v) / len(v) for v in samples.values()),
        joining_replicas=sum(1 for s in latest.values() if s.status in ("starting", "warming")),
    )


@dataclass(frozen=True)
class SlotDemand:
    """The window's distinct adapters and how many of the fleet's replicas hold them a GPU slot each."""

    active_adapters: int  # in this window and the earlier ones given
    slots_per_replica: int  # the smallest slot count a serving replica reported; 0 when none did
    replicas: int  # ceil(active / slots_per_replica); 0 when slots are unknown
    window_adapters: tuple[str, ...] = ()  # the ones requested in this window, sorted


def slot_demand(
    requests: Iterable[RequestCompleted],
    states: Iterable[ReplicaState],
    earlier: Iterable[Iterable[str]] = (),
) -> SlotDemand:
    """Adapters requested on the fleet's replicas in the window, and in the earlier windows' sets given,
    against the slots its replicas have.

    Affinity routing gives each adapter a home, so a fleet of n replicas holds every active adapter in a
    slot at best when active <= n x slots; fewer replicas than this thrash (evict what is needed again).
    An adapter asked for every few seconds is active though one short window may miss it, hence the
    earlier windows."""
    latest: dict[str, ReplicaState] = {}
    for s in states:
        if s.replica_id not in latest or s.occurred_at > latest[s.replica_id].occurred_at:
            latest[s.replica_id] = s
    window = {r.adapter_id for r in requests if r.replica_id in latest}
    active = window.union(*earlier)
    slots = [s.gpu_slots for s in latest.values() if s.status != "draining" and s.gpu_slots > 0]
    per = min(slots, default=0)
    return SlotDemand(len(active), per, math.ceil(len(active) / per) if per else 0, tuple(sorted(window)))


@dataclass(frozen=True)
class TenantCost:
    tenant_id: str
    tokens: int  # prompt + completion
    cost_usd: float
    usd_per_million_tokens: float | None  # None when the tenant moved no tokens


def tenant_costs(
    requests: Sequence[RequestCompleted], billed_replicas: int, window_s: float, gpu_hour_usd: float
) -> dict[str, TenantCost]:
    """Charge the window's whole GPU bill to tenants by their share of request-seconds.

    A request holds a batch row (and its KV cache) for its whole duration, so request-seconds are the fairest
    proxy for GPU share; idle capacity is spread the same way. With no durations, tokens are the share.
    """
    bill = billed_replicas * gpu_hour_usd * window_s / 3600.0
    busy: defaultdict[str, float] = defaultdict(float)  # request-seconds
    tokens: Counter[str] = Counter()
    for r in requests:
        busy[r.tenant_id] += r.total_s
        tokens[r.tenant_id] += r.prompt_tokens + r.completion_tokens
    weights: Mapping[str, float] = busy if sum(busy.values()) > 0 else tokens
    total = sum(weights.values())
    out: dict[str, TenantCost] = {}
    for tenant in sorted(set(busy) | set(tokens)):
        cost = bill * weights[tenant] / total if total > 0 else 0.0
        per_million = cost / tokens[tenant] * 1e6 if tokens[tenant] else None
        out[tenant] = TenantCost(tenant, tokens[tenant], cost, per_million)
    return out
