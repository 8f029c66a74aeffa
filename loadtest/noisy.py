"""The noisy-neighbour scenario: two tenants on one deployment, one of them bursting to 10 times its rate.

Both tenants send Poisson arrivals at their usual rate for the whole run; over the burst window the noisy
tenant sends at burst_factor times its rate. Every request is streamed through the public API and timed
(loadtest.client.send). The summary gives each tenant's TTFT p50/p95 over the requests that arrived inside
the burst window, the quiet tenant's share of requests over its SLO, and status counts.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.client import RequestRecord, send
from sim.workload import Request


@dataclass(frozen=True)
class NoisyConfig:
    gateway: str
    quiet_model: str  # alias of the quiet tenant (its tenant is the part before the first "/")
    noisy_model: str
    keys: dict[str, str]  # tenant -> API key
    rate: float = 0.5  # each tenant's usual requests/s
    burst_factor: float = 10.0
    duration_s: float = 90.0
    burst_start_s: float = 20.0
    burst_s: float = 40.0
    prompt_tokens: int = 32
    output_tokens: int = 16
    slo_s: float = 1.0
    seed: int = 0
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Arrival:
    tenant_model: str
    at_s: float


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    times: list[float] = []
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return times
        times.append(t)


def arrivals(cfg: NoisyConfig) -> list[Arrival]:
    """Both tenants' arrival times: the usual rate throughout, plus the noisy tenant's burst."""
    rng = random.Random(cfg.seed)
    burst_end = cfg.burst_start_s + cfg.burst_s
    out = [Arrival(cfg.quiet_model, t) for t in _poisson(rng, cfg.rate, 0.0, cfg.duration_s)]
    out += [Arrival(cfg.noisy_model, t) for t in _poisson(rng, cfg.rate, 0.0, cfg.duration_s)]
    extra = cfg.rate * (cfg.burst_factor - 1)
    out += [Arrival(cfg.noisy_model, t) for t in _poisson(rng, extra, cfg.burst_start_s, burst_end)]
    return sorted(out, key=lambda a: a.at_s)


def in_burst(cfg: NoisyConfig, at_s: float) -> bool:
    return cfg.burst_start_s <= at_s < cfg.burst_start_s + cfg.burst_s


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    if len(values) == 1:
        return {"p50": round(values[0], 3), "p95": round(values[0], 3)}
    return {
        "p50": round(statistics.median(values), 3),
        "p95": round(statistics.quantiles(values, n=20, method="inclusive")[-1], 3),
    }


def summarise(cfg: NoisyConfig, records: list[RequestRecord]) -> dict[str, Any]:
    """Per tenant: requests and statuses, and TTFT p50/p95 over the ones that arrived in the burst."""
    out: dict[str, Any] = {"slo_s": cfg.slo_s, "burst_factor": cfg.burst_factor, "rate": cfg.rate}
    for role, model in (("quiet", cfg.quiet_model), ("noisy", cfg.noisy_model)):
        mine = [r for r in records if r.model == model]
        burst = [r.ttft_s for r in mine if in_burst(cfg, r.arrival_s) and r.ttft_s >= 0]
        out[role] = {
            "model": model,
            "requests": len(mine),
            "in_burst": len([r for r in mine if in_burst(cfg, r.arrival_s)]),
            "status": dict(Counter(str(r.status) for r in mine)),
            "errors": dict(Counter(r.error for r in mine if r.error)),
            "ttft_in_burst_s": _quantiles(burst),
            "over_slo_in_burst": sum(1 for t in burst if t > cfg.slo_s),
        }
    return out


async def run_noisy(
    cfg: NoisyConfig, on_done: Callable[[RequestRecord], object] = lambda _r: None
) -> list[RequestRecord]:
    """Send every arrival at its time (open loop) and return what each request saw."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=cfg.gateway, timeout=cfg.timeout_s, limits=limits) as client:

        async def one(i: int, a: Arrival, t0: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + a.at_s - time.perf_counter()))
            req = Request(i, a.at_s, a.tenant_model, cfg.prompt_tokens, cfg.output_tokens)
            key = cfg.keys[a.tenant_model.split("/", 1)[0]]
            rec = await send(client, req, a.tenant_model, key, cfg.rate, temperature=0.0)
            on_done(rec)
            return rec

        t0 = time.perf_counter()
        return list(await asyncio.gather(*(one(i, a, t0) for i, a in enumerate(arrivals(cfg)))))
