"""Closing a window: its deduplicated events in, every output event and metric value out (pure).

Output event ids are derived from (what, subject, window), so closing the same window twice (after a crash
between publishing and forgetting the window) publishes the same events, which consumers dedupe.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace

from schemas.events import (
    AdapterStats,
    Alert,
    AutoscaleSignal,
    Event,
    ReplicaEvent,
    ReplicaState,
    RequestCompleted,
)
from stats_stream import aggregates as agg
from stats_stream import signals
from stats_stream.config import SignalSettings
from stats_stream.windows import from_ms

_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "lorafleet/stats_stream")


def output_id(what: str, subject: str, window_ms: int) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"{what}|{subject}|{window_ms}")


@dataclass(frozen=True)
class WindowReport:
    window_ms: int
    adapter_stats: list[AdapterStats]
    alerts: list[Alert]
    autoscale: AutoscaleSignal
    latencies: dict[str, agg.TenantLatency]
    costs: dict[str, agg.TenantCost]
    churn: dict[str, agg.ReplicaChurn]
    tier_shares: dict[str, float]
    load: agg.FleetLoad
    tokens_per_s: float
    scale_state: signals.ScaleState


def close_window(
    window_ms: int,
    events: Iterable[Event],
    scale_state: signals.ScaleState,
    settings: SignalSettings,
    fleet: str = "default",
) -> WindowReport:
    """Everything one closed window produces."""
    unique = agg.dedupe(events)
    requests = [e for e in unique if isinstance(e, RequestCompleted)]
    ours = settings.replica_id_prefix
    replica_events = [e for e in unique if isinstance(e, ReplicaEvent) and e.replica_id.startswith(ours)]
    # the fleet the autoscale signal sizes: a merged replica serves one adapter and has its own actuator
    states = [
        e
        for e in unique
        if isinstance(e, ReplicaState) and e.replica_id.startswith(ours) and e.merged_adapter_id is None
    ]
    window_s = settings.window_s
    start, end = from_ms(window_ms), from_ms(window_ms + int(window_s * 1000))

    adapters = agg.adapter_windows(requests, window_s)
    latencies = agg.tenant_latencies(requests)
    churn = agg.replica_churn(replica_events, window_s)
    load = agg.fleet_load(states)
    span = settings.scale_down_windows - 1  # the windows a scale-down waits for, with this one
    slots = agg.slot_demand(requests, states, scale_state.active[-span:] if span > 0 else ())
    costs = agg.tenant_costs(requests, load.billed_replicas, window_s, settings.gpu_hour_usd)
    thrashing = signals.thrashing(churn.values(), settings)
    decision = signals.decide_replicas(load, scale_state, settings, len(thrashing))

    stats = [
        AdapterStats(
            event_id=output_id("adapter.stats", a.adapter_id, window_ms),
            occurred_at=end,
            adapter_id=a.adapter_id,
            window_start=start,
            window_seconds=window_s,
            requests=a.requests,
            tokens_per_s=a.tokens_per_s,
            gpu_hit_rate=a.gpu_hit_rate,
            errors=a.errors,
            p50_ttft_s=a.p50_ttft_s,
            p95_ttft_s=a.p95_ttft_s,
        )
        for a in adapters.values()
    ]
    decisions = signals.slo_breaches(latencies.values(), settings) + thrashing
    alerts = [
        Alert(
            event_id=output_id(d.kind, d.subject, window_ms),
            occurred_at=end,
            subject=d.subject,
            kind=d.kind,
            severity=d.severity,
            message=d.message,
            value=d.value,
            threshold=d.threshold,
        )
        for d in decisions
    ]
    autoscale = AutoscaleSignal(
        event_id=output_id("autoscale", fleet, window_ms),
        occurred_at=end,
        fleet=fleet,
        current_replicas=load.serving_replicas,
        desired_replicas=decision.desired,
        reason=f"{decision.reason} active_adapters={slots.active_adapters} slot_demand={slots.replicas}",
        hot_adapters=signals.hot_adapters(adapters, load.serving_replicas, settings),
        thrashing_replicas=len(thrashing),
        active_adapters=slots.active_adapters,
        slot_demand=slots.replicas,
    )
    return WindowReport(
        window_ms=window_ms,
        adapter_stats=stats,
        alerts=alerts,
        autoscale=autoscale,
        latencies=latencies,
        costs=costs,
        churn=churn,
        tier_shares=agg.tier_shares(requests),
        load=load,
        tokens_per_s=sum(a.tokens_per_s for a in adapters.values()),
        scale_state=replace(
            decision.state,
            active=(*scale_state.active, slots.window_adapters)[-settings.scale_down_windows :],
        ),
    )
