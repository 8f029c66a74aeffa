"""The console's fleet snapshot from the router's replica view and the console feed (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from schemas.console import AdapterWindow, AlertView, FleetReplica, FleetSnapshot, ReplicaPhase
from schemas.events import ReplicaState

# A replica silent this long is no longer shown at all (it left the fleet or was replaced).
FORGET_AFTER_S = 60.0


def phase(state: ReplicaState, age_s: float, stale_s: float) -> ReplicaPhase:
    """The status it reported; `merged` for a ready merged replica; `stale` once its state is too old."""
    if age_s > stale_s:
        return "stale"
    if state.status == "ready" and state.merged_adapter_id is not None:
        return "merged"
    return state.status


def gpu_hit_rate(windows: Iterable[AdapterWindow]) -> float | None:
    """The share of requests served from a GPU slot, weighted by each adapter's requests."""
    requests = hits = 0.0
    for w in windows:
        requests += w.requests
        hits += w.requests * w.gpu_hit_rate
    return hits / requests if requests else None


def fleet_snapshot(
    states: Iterable[tuple[ReplicaState, float]],
    windows: list[AdapterWindow],
    alerts: list[AlertView],
    stale_s: float,
    replica_prefix: str = "",
    hit_rates: Mapping[str, float | None] | None = None,
    at: datetime | None = None,
) -> FleetSnapshot:
    """Replicas seen in the last FORGET_AFTER_S with this gateway's GPU hit rate on each, the stats windows of
    the adapters they hold, and the alerts but a replica alert about another fleet's replica (adapter.stats
    and alerts are shared by every fleet on one Kafka; replica ids carry the fleet's prefix)."""
    replicas = [
        FleetReplica(
            **s.model_dump(include=set(FleetReplica.model_fields)),
            phase=phase(s, age, stale_s),
            age_s=age,
            gpu_hit_rate=(hit_rates or {}).get(s.replica_id),
        )
        for s, age in states
        if age <= FORGET_AFTER_S
    ]
    held = {a for r in replicas for a in (*r.gpu_adapters, *r.ram_adapters, *r.disk_adapters)}
    held |= {r.merged_adapter_id for r in replicas if r.merged_adapter_id is not None}
    shown = [w for w in windows if w.adapter_id in held]
    return FleetSnapshot(
        at=at or datetime.now(UTC),
        replicas=replicas,
        adapter_stats=shown,
        gpu_hit_rate=gpu_hit_rate(shown),
        alerts=[a for a in alerts if a.kind != "thrashing" or a.subject.startswith(replica_prefix)],
    )
