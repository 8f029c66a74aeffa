"""Throughput with 1, 8 and 32 distinct adapters in a batch: the brief's measure of the unmerged overhead.

A burst is `size` concurrent streaming requests at temperature 0 on one long-answer prompt; request j uses
alias j % D, so the burst carries D distinct adapters. Each burst is measured as output tokens (the
server's usage count) over its wall time. The variants interleave, `repeats` times, so a noisy neighbour
slows them alike; the report gives each variant's median and its ratio to one adapter.

Before each burst, when the replicas' internal URLs are known, the burst's adapters are loaded into GPU
slots through the replica's own load API (the pre-warm door) so that every variant starts warm and the
router spreads it the same way: replica r of R loads the adapters j with j % R != r first and its own
share (j % R == r) last, so when a replica cannot hold all D its LRU keeps exactly its share, and when it
can, every replica holds all D. Without replica URLs an unmeasured burst warms each variant instead.
The base model is not requestable through the public API (an unknown model is a 404, never a fallback to
the base), so the ratio to base comes from `lorafleet bench engine`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.client import RequestRecord, send
from loadtest.runner import LoadTestConfig, client_for, key_for
from lorafleet.profile import DEV_TOKEN
from sim.workload import Request

PROMPT = "Write a long, detailed story about a lighthouse keeper and the ships she guides through storms."


@dataclass(frozen=True)
class BurstConfig:
    distinct: tuple[int, ...] = (1, 8, 32)
    size: int = 32  # concurrent requests per burst
    max_tokens: int = 64
    repeats: int = 3
    replica_token: str = DEV_TOKEN  # the replicas' LORAFLEET_REPLICA_SERVICE_TOKEN
    settle_s: float = 2.5  # after a pre-warm: the replicas' next state report reaches the router


def prewarm_order(adapters: list[str], replicas: list[str]) -> dict[str, list[str]]:
    """replica -> adapters to load, in order: the others' share first, its own share (j % R == r) last."""
    out = {}
    for r, rid in enumerate(replicas):
        own = [a for j, a in enumerate(adapters) if j % len(replicas) == r]
        out[rid] = [a for a in adapters if a not in own] + own
    return out


async def resolve(client: httpx.AsyncClient, cfg: LoadTestConfig, models: list[str]) -> dict[str, str]:
    """alias -> adapter id (x-adapter-id), one 1-token request each."""

    async def one(i: int, model: str) -> tuple[str, str]:
        rec = await send(client, Request(i, 0.0, "", 8, 1), model, key_for(model, cfg.keys), 0.0, PROMPT, 0.0)
        if rec.status != 200:
            raise RuntimeError(f"{model}: {rec.status} {rec.error}")
        return model, rec.adapter_id

    return dict(await asyncio.gather(*(one(i, m) for i, m in enumerate(models))))


async def prewarm(replicas: dict[str, str], adapters: list[str], token: str) -> None:
    """Load the burst's adapters into GPU slots on every replica (in prewarm_order), replicas in parallel."""
    order = prewarm_order(adapters, list(replicas))
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=120) as c:

        async def warm(rid: str) -> None:
            for aid in order[rid]:
                resp = await c.post(
                    f"{replicas[rid].rstrip('/')}/internal/replicas/{rid}/adapters/{aid}/load"
                )
                resp.raise_for_status()

        await asyncio.gather(*(warm(rid) for rid in replicas))


async def burst_once(
    client: httpx.AsyncClient, cfg: LoadTestConfig, models: list[str], burst: BurstConfig
) -> tuple[list[RequestRecord], float]:
    """`size` concurrent requests, request j on models[j % len(models)]; (records, wall seconds)."""

    async def one(j: int) -> RequestRecord:
        model = models[j % len(models)]
        req = Request(j, 0.0, "", 24, burst.max_tokens)
        return await send(client, req, model, key_for(model, cfg.keys), 0.0, PROMPT, 0.0)

    start = time.perf_counter()
    records = await asyncio.gather(*(one(j) for j in range(burst.size)))
    return list(records), time.perf_counter() - start


def measure(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """One burst's record: tokens_per_s is exactly output_tokens / wall_s (rounding is the report's job)."""
    ok = [r for r in records if r.status == 200 and r.usage_completion_tokens >= 0]
    tokens = sum(r.usage_completion_tokens for r in ok)
    return {
        "ok": len(ok),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "tiers": dict(Counter(r.tier for r in ok)),
    }


def summarise(runs: dict[int, list[dict[str, Any]]], burst: BurstConfig, prewarmed: bool) -> dict[str, Any]:
    """Median tokens/s per distinct count over repeats, and each over one adapter's."""
    median = {d: statistics.median(r["tokens_per_s"] or 0.0 for r in rs) for d, rs in runs.items()}
    one = median.get(1)
    return {
        "size": burst.size,
        "max_tokens": burst.max_tokens,
        "repeats": burst.repeats,
        "prewarmed": prewarmed,
        "tokens_per_s": {str(d): v for d, v in median.items()},
        "ratio_to_1_adapter": {str(d): v / one for d, v in median.items()} if one else None,
        "ratio_to_base": None,
        "base_note": "the public API serves no base model; `lorafleet bench engine` gives the ratio to base",
        "runs": {str(d): rs for d, rs in runs.items()},
    }


async def run_bursts(
    cfg: LoadTestConfig,
    burst: BurstConfig,
    replicas: dict[str, str] | None = None,
    on_burst: Callable[[], object] = lambda: None,  # its result is ignored
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Every distinct count (up to the number of aliases), interleaved, `repeats` times."""
    counts = [d for d in burst.distinct if d <= len(cfg.models)]
    runs: dict[int, list[dict[str, Any]]] = {d: [] for d in counts}
    async with client_for(cfg, transport) as client:
        aliases = list(cfg.models[: max(counts, default=0)])
        adapter_of = await resolve(client, cfg, aliases) if replicas else {}
        for rep in range(burst.repeats + (0 if replicas else 1)):
            for d in counts:
                models = aliases[:d]
                if replicas:
                    await prewarm(replicas, [adapter_of[m] for m in models], burst.replica_token)
                    await asyncio.sleep(burst.settle_s)
                records, wall = await burst_once(client, cfg, models, burst)
                on_burst()
                if replicas or rep > 0:  # without a pre-warm the first round only warms
                    runs[d].append(measure(records, wall))
    return summarise(runs, burst, bool(replicas))
