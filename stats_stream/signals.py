"""Decisions over a window's aggregates: SLO and thrashing alerts, hot adapters, desired replica count."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.events import HotAdapter
from stats_stream.aggregates import AdapterWindow, FleetLoad, ReplicaChurn, TenantLatency
from stats_stream.config import SignalSettings

# Past this multiple of the threshold an alert is critical rather than a warning.
CRITICAL_FACTOR = 2.0


@dataclass(frozen=True)
class AlertDecision:
    subject: str  # tenant_id or replica_id
    kind: Literal["slo_ttft", "thrashing"]
    severity: Literal["warning", "critical"]
    value: float
    threshold: float
    message: str


def _severity(value: float, threshold: float) -> Literal["warning", "critical"]:
    return "critical" if value >= CRITICAL_FACTOR * threshold else "warning"


def slo_breaches(latencies: Iterable[TenantLatency], settings: SignalSettings) -> list[AlertDecision]:
    """Tenants whose p95 TTFT is over target, given enough requests to call it a p95."""
    target = settings.slo_ttft_s
    return [
        AlertDecision(
            t.tenant_id,
            "slo_ttft",
            _severity(t.p95_ttft_s, target),
            t.p95_ttft_s,
            target,
            f"tenant {t.tenant_id}: p95 TTFT {t.p95_ttft_s:.3f}s over target {target:.3f}s "
            f"({t.requests} requests, p50 {t.p50_ttft_s:.3f}s)",
        )
        for t in latencies
        if t.requests >= settings.slo_min_requests and t.p95_ttft_s > target
    ]


def thrashing(churn: Iterable[ReplicaChurn], settings: SignalSettings) -> list[AlertDecision]:
    """Replicas evicting adapters faster than the thrashing line."""
    line = settings.thrash_evictions_per_min
    return [
        AlertDecision(
            c.replica_id,
            "thrashing",
            _severity(c.evictions_per_min, line),
            c.evictions_per_min,
            line,
            f"replica {c.replica_id}: {c.evictions_per_min:.1f} evictions/min "
            f"({c.loads_per_min:.1f} loads/min) over {line:.1f}; asking the autoscaler for a replica",
        )
        for c in churn
        if c.evictions_per_min > line
    ]


def hot_adapters(
    adapters: Mapping[str, AdapterWindow], fleet_size: int, settings: SignalSettings
) -> list[HotAdapter]:
    """Adapters one replica cannot carry: owners = ceil(tokens/s / capacity), capped by the fleet size.

    The placement worker uses max(its default k, owners), so an owner count of 2 may change nothing.
    """
    cap = max(fleet_size, 1)
    hot = [
        HotAdapter(
            adapter_id=a.adapter_id,
            tokens_per_s=a.tokens_per_s,
            owners=min(math.ceil(a.tokens_per_s / settings.replica_capacity_tps), cap),
        )
        for a in adapters.values()
        if a.tokens_per_s > settings.replica_capacity_tps
    ]
    return sorted(hot, key=lambda h: (-h.tokens_per_s, h.adapter_id))


@dataclass(frozen=True)
class ScaleState:
    """What hysteresis remembers between windows: the last answer, recent raw demands, and the adapters
    active in each of the recent windows (the slot demand counts them all, as the scale-down waits for
    all of those windows)."""

    previous: int | None = None
    recent: tuple[int, ...] = field(default_factory=tuple)
    active: tuple[tuple[str, ...], ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "previous": self.previous,
            "recent": list(self.recent),
            "active": [list(a) for a in self.active],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> ScaleState:
        if not raw:
            return cls()
        active = tuple(tuple(a) for a in raw.get("active", ()))
        return cls(raw.get("previous"), tuple(raw.get("recent", ())), active)


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    raw: int
    reason: str
    state: ScaleState


def raw_demand(load: FleetLoad, settings: SignalSettings, thrashing: int = 0) -> int:
    """KEDA AverageValue maths: the largest of ceil(metric / per-replica threshold), clamped to min/max.

    thrashing: replicas over the eviction line this window. Their active sets outgrow their GPU slots, and
    owner counts cannot fix that (another owner is one more replica holding the adapter), so the fleet asks
    for one replica more than it serves; not while one is still joining (its share of the adapters has not
    moved to it yet), so thrashing adds at most one replica per start-up."""
    by_queue = math.ceil(load.queue_depth / settings.queue_per_replica)
    by_tokens = math.ceil(load.tokens_in_flight / settings.tokens_in_flight_per_replica)
    by_thrash = load.serving_replicas + 1 if thrashing and not load.joining_replicas else 0
    return min(max(by_queue, by_tokens, by_thrash, settings.min_replicas), settings.max_replicas)


def decide_replicas(
    load: FleetLoad, state: ScaleState, settings: SignalSettings, thrashing: int = 0
) -> ScaleDecision:
    """Scale up at once to the raw demand; scale down only to the highest demand of the last
    `scale_down_windows` windows, and by at most `max_scale_down_step` per window.

    GPU replicas take minutes to start, so a brief dip must not release one that is needed again soon.
    """
    raw = raw_demand(load, settings, thrashing)
    recent = (*state.recent, raw)[-settings.scale_down_windows :]
    previous = state.previous if state.previous is not None else load.serving_replicas
    previous = min(max(previous, settings.min_replicas), settings.max_replicas)
    why = (
        f"queue_depth={load.queue_depth:.1f} tokens_in_flight={load.tokens_in_flight:.0f} "
        f"thrashing={thrashing} raw={raw} previous={previous}"
    )
    if raw > previous:
        desired, verdict = raw, "scale up"
    elif len(recent) >= settings.scale_down_windows and max(recent) < previous:
        desired = max(max(recent), previous - settings.max_scale_down_step)
        verdict = "scale down"
    else:
        desired, verdict = previous, "hold"
    return ScaleDecision(desired, raw, f"{verdict}: {why}", ScaleState(desired, recent, state.active))
