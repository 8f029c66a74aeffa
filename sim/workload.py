"""The workload both the simulator and the load test replay: Zipf adapter popularity, Poisson arrivals,
log-normal prompt and output lengths with the brief's means (750 and 250 tokens). Traces are JSONL."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkloadConfig:
    adapters: int = 5000
    rate: float = 40.0  # requests per second, Poisson
    zipf_s: float = 1.0  # popularity of the adapter ranked i is proportional to 1 / i**s
    duration_s: float = 3600.0
    prompt_mean: float = 750.0
    prompt_sigma: float = 0.6  # of the underlying normal; the mean stays prompt_mean
    output_mean: float = 250.0
    output_sigma: float = 0.6
    max_tokens: int = 4096  # a length above this is clipped (the KV budget of one request)
    seed: int = 0
    tenants: int = 0  # tenants owning the adapters (sim.workload.tenant_id); 0: one per adapter


@dataclass(frozen=True)
class Request:
    """One request of a trace: when it arrives, for which adapter, and its token counts."""

    request_id: int
    arrival_s: float
    adapter_id: str
    prompt_tokens: int
    output_tokens: int
    tenant: str = ""  # the adapter's owner; "" where the trace does not say


def adapter_id(rank: int) -> str:
    """The id of the adapter with popularity rank `rank` (0 = most popular)."""
    return f"adapter-{rank:05d}"


def tenant_id(rank: int, tenants: int) -> str:
    """The tenant owning the adapter of popularity rank `rank`: rank mod `tenants` (tenant 0 owns the top)."""
    return f"tenant-{rank % max(tenants, 1):05d}"


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalised popularity of ranks 0..n-1."""
    raw = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


def _lognormal(rng: random.Random, mean: float, sigma: float, cap: int) -> int:
    mu = math.log(mean) - sigma * sigma / 2  # E[exp(N(mu, sigma))] = mean
    return max(1, min(cap, round(rng.lognormvariate(mu, sigma))))


def generate(cfg: WorkloadConfig) -> list[Request]:
    """A trace of Poisson arrivals over cfg.duration_s, deterministic from cfg.seed."""
    rng = random.Random(cfg.seed)
    cum = list(itertools.accumulate(zipf_weights(cfg.adapters, cfg.zipf_s)))
    out: list[Request] = []
    t = rng.expovariate(cfg.rate)
    while t < cfg.duration_s:
        rank = min(bisect.bisect_left(cum, rng.random()), cfg.adapters - 1)
        out.append(
            Request(
                request_id=len(out),
                arrival_s=t,
                adapter_id=adapter_id(rank),
                prompt_tokens=_lognormal(rng, cfg.prompt_mean, cfg.prompt_sigma, cfg.max_tokens),
                output_tokens=_lognormal(rng, cfg.output_mean, cfg.output_sigma, cfg.max_tokens),
                tenant=tenant_id(rank, cfg.tenants or cfg.adapters),
            )
        )
        t += rng.expovariate(cfg.rate)
    return out


def expected_tokens_per_s(cfg: WorkloadConfig) -> dict[str, float]:
    """adapter_id -> expected output tokens/s: the demand a placement worker would learn from stats."""
    per_request = cfg.rate * cfg.output_mean
    return {adapter_id(i): w * per_request for i, w in enumerate(zipf_weights(cfg.adapters, cfg.zipf_s))}


def save(trace: Iterable[Request], path: Path) -> None:
    with path.open("w") as f:
        for r in trace:
            f.write(json.dumps(asdict(r)) + "\n")


def load(path: Path) -> list[Request]:
    with path.open() as f:
        return [Request(**json.loads(line)) for line in f if line.strip()]
