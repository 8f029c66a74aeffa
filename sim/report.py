"""The simulator's JSON report: TTFT percentiles overall and by tier, cache hit rates, loads and evictions
per minute per replica, utilisation, GPUs needed and cost per million tokens."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from sim.replica import SimRequest
from sim.simulator import SimResult

TIERS = ("gpu", "ram", "disk", "remote")


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))]


def ttft_stats(requests: list[SimRequest]) -> dict[str, Any]:
    values = sorted(r.first_token_s - r.req.arrival_s for r in requests)
    out: dict[str, Any] = {"count": len(values)}
    for q in (50, 95, 99):
        v = percentile(values, q)
        out[f"p{q}_s"] = None if v is None else round(v, 4)
    return out


def tenant_p95(
    samples: Iterable[tuple[str, float]], top: int = 5, min_requests: int = 20
) -> dict[str, Any] | None:
    """p95 TTFT of the `top` tenants by traffic and of the worst tenant, from (tenant, TTFT s) pairs.

    The worst is taken among tenants with at least `min_requests` requests (a p95 of three requests is
    noise), or among the top ones when none has that many. None when no sample names a tenant."""
    by: dict[str, list[float]] = defaultdict(list)
    for tenant, ttft in samples:
        if tenant:
            by[tenant].append(ttft)
    if not by:
        return None
    p95 = {t: percentile(sorted(v), 95) or 0.0 for t, v in by.items()}

    def row(t: str) -> dict[str, Any]:
        return {"tenant": t, "requests": len(by[t]), "p95_ttft_s": round(p95[t], 4)}

    busiest = sorted(by, key=lambda t: (-len(by[t]), t))[:top]
    heavy = [t for t in by if len(by[t]) >= min_requests]
    return {
        "tenants": len(by),
        "top": [row(t) for t in busiest],
        "worst": row(max(heavy or busiest, key=lambda t: (p95[t], t))),
        "worst_among": f"tenants with >= {min_requests} requests" if heavy else f"the top {len(busiest)}",
    }


def tpot_p50(requests: list[SimRequest]) -> float | None:
    values = sorted(
        (r.finish_s - r.first_token_s) / (r.req.output_tokens - 1)
        for r in requests
        if r.req.output_tokens > 1
    )
    v = percentile(values, 50)
    return None if v is None else round(v, 5)


def gpus_needed(result: SimResult, headroom: float) -> dict[str, float]:
    """The brief's arithmetic on the trace's token rates and the timing model: decode plus prefill GPUs."""
    span = max(result.duration_s, 1e-9)
    out_tps = sum(r.req.output_tokens for r in result.requests) / span
    in_tps = sum(r.req.prompt_tokens for r in result.requests) / span
    decode = out_tps / result.timing.decode_tokens_per_s()
    prefill = in_tps / result.timing.prefill_tokens_per_s
    return {
        "decode": round(decode, 2),
        "prefill": round(prefill, 2),
        "total": round(decode + prefill, 2),
        "with_headroom": math.ceil((decode + prefill) * (1 + headroom)),
    }


def build(result: SimResult, gpu_hour_usd: float = 2.5, headroom: float = 0.3) -> dict[str, Any]:
    cfg = result.config
    measured = [r for r in result.requests if r.req.arrival_s >= cfg.warmup_s]
    found = Counter(r.found_in for r in measured)
    n = max(len(measured), 1)
    misses = n - found["gpu"]
    minutes = max(result.duration_s, 1e-9) / 60
    per_replica: list[dict[str, Any]] = []  # replica_id, then one float per figure
    for rep in result.replicas:
        per_replica.append(
            {
                "replica_id": rep.replica_id,
                "gpu_loads_per_min": sum(rep.loads.values()) / minutes,
                "gpu_evictions_per_min": rep.slots.evictions / minutes,
                "ram_evictions_per_min": rep.ram_evictions / minutes,
                "busy_fraction": rep.busy_s / max(result.duration_s, 1e-9),
                "mean_batch": rep.row_s / max(result.duration_s, 1e-9),
            }
        )

    def summary(key: str) -> dict[str, float]:
        values: list[float] = [p[key] for p in per_replica]
        return {"mean": round(sum(values) / len(values), 3), "max": round(max(values), 3)}

    tokens = sum(r.req.prompt_tokens + r.req.output_tokens for r in result.requests)
    out_tokens = sum(r.req.output_tokens for r in result.requests)
    fleet_usd = cfg.replicas * gpu_hour_usd * result.duration_s / 3600
    return {
        "config": {
            "replicas": cfg.replicas,
            "routing": cfg.routing,
            "owners_k": cfg.owners_k,
            "spill_wait_s": cfg.spill_wait_s,
            "gpu_slots": cfg.sizes.gpu_slots,
            "ram_bytes": cfg.sizes.ram_bytes,
            "warmup_s": cfg.warmup_s,
            "seed": cfg.seed,
            "replan_s": cfg.replan_s,
            "gpu_tokens_per_s": cfg.gpu_tokens_per_s,
            "gpu_slot_fraction": cfg.gpu_slot_fraction,
        },
        "timing": {
            "step_base_s": result.timing.step_base_s,
            "per_row_s": result.timing.per_row_s,
            "per_adapter_s": result.timing.per_adapter_s,
            "prefill_tokens_per_s": result.timing.prefill_tokens_per_s,
            "max_batch": result.timing.max_batch,
            "load_s": result.timing.load_s,
            "decode_tokens_per_s_per_replica": round(result.timing.decode_tokens_per_s(), 1),
        },
        "requests": len(result.requests),
        "measured_requests": len(measured),
        "simulated_s": round(result.duration_s, 3),
        "ttft": ttft_stats(measured),
        "ttft_by_tier": {t: ttft_stats([r for r in measured if r.found_in == t]) for t in TIERS if found[t]},
        "tpot_p50_s": tpot_p50(measured),
        "ttft_by_tenant": tenant_p95((r.req.tenant, r.first_token_s - r.req.arrival_s) for r in measured),
        "tier_share": {t: round(found[t] / n, 5) for t in TIERS},
        "gpu_hit_rate": round(found["gpu"] / n, 5),
        "ram_hit_rate": round(found["ram"] / misses, 5) if misses else None,  # of GPU misses
        "route_reasons": dict(Counter(r.route_reason for r in measured)),
        "per_replica": {
            k: summary(k)
            for k in (
                "gpu_loads_per_min",
                "gpu_evictions_per_min",
                "ram_evictions_per_min",
                "busy_fraction",
                "mean_batch",
            )
        },
        "probe": result.probe.summary(len(measured), cfg.sizes.gpu_slots),
        "adapters_with_raised_owners": sum(1 for k in result.owners_per_adapter.values() if k > cfg.owners_k),
        "gpus_needed": gpus_needed(result, headroom),
        "cost": {
            "gpu_hour_usd": gpu_hour_usd,
            "fleet_usd_per_hour": cfg.replicas * gpu_hour_usd,
            "usd_per_million_tokens": round(fleet_usd / (tokens / 1e6), 4) if tokens else None,
            "usd_per_million_output_tokens": round(fleet_usd / (out_tokens / 1e6), 4) if out_tokens else None,
        },
    }


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A routing A/B on one trace: routing mode -> hit rates, TTFT percentiles and loads side by side."""
    return {
        mode: {
            "gpu_hit_rate": rep["gpu_hit_rate"],
            "ram_hit_rate": rep["ram_hit_rate"],
            "p50_ttft_s": rep["ttft"]["p50_s"],
            "p95_ttft_s": rep["ttft"]["p95_s"],
            "p99_ttft_s": rep["ttft"]["p99_s"],
            "gpu_loads_per_min_per_replica": rep["per_replica"]["gpu_loads_per_min"]["mean"],
        }
        for mode, rep in runs.items()
    }
