"""`lorafleet bench dominant`: one dominant adapter through `lorafleet loadtest`'s own runner, before and
after owner counts follow traffic, each on a fresh private stack (harness/stacks/scaleup.py).

Four tenants, one adapter each; a Zipf mix with a steep exponent gives the first (acme's) most of the
requests. Both runs have the same replicas, trace and settings but one: "before" prices a replica's
capacity so high that every adapter keeps one owner, as when traffic never reached placement; "after" uses
a CPU replica's capacity, so the dominant adapter's measured tokens/s gives it more owners. The result is
the dominant adapter's owner count over time (from the placements table) and each tenant's TTFT
percentiles as the load test measured them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import typer

from harness.stacks.scaleup import ScaleupConfig, ScaleupStack, scaleup_stack, wait_for
from loadtest.cli import run_loadtest
from loadtest.runner import LoadTestConfig
from lorafleet.config import PlatformSettings
from sim.workload import WorkloadConfig

# adapter id -> alias, most popular first (the load test's Zipf rank i is models[i])
ADAPTERS = {
    "acme-dominant": "acme/dominant:prod",
    "globex-sales": "globex/sales:prod",
    "initech-help": "initech/help:prod",
    "umbrella-desk": "umbrella/desk:prod",
}
DOMINANT = next(iter(ADAPTERS))


@dataclass(frozen=True)
class DominantConfig:
    replicas: int = 3
    rate: float = 0.8  # requests/s, Poisson: within what three CPU replicas on 2 cores serve
    duration_s: float = 90.0
    zipf: float = 2.5  # the first of 4 adapters takes about 79% of the requests
    prompt_mean: float = 40.0
    output_mean: float = 12.0
    # "after": one CPU replica's capacity for the placement worker's owner count (tok/s)
    capacity_tokens_per_s: float = 2.0
    window_s: float = 2.0
    seed: int = 0


def stack_config(cfg: DominantConfig, owners_follow_traffic: bool) -> ScaleupConfig:
    capacity = cfg.capacity_tokens_per_s if owners_follow_traffic else 1e9
    return ScaleupConfig(
        adapters=ADAPTERS,
        window_s=cfg.window_s,
        max_num_seqs=4,
        unmanaged=cfg.replicas,
        max_replicas=cfg.replicas,
        stats_min_replicas=cfg.replicas,
        queue_per_replica=1000,  # the fleet's size is fixed: owners, not replicas, are measured
        env={
            "LORAFLEET_PLACEMENT_DEFAULT_OWNERS": "1",
            "LORAFLEET_GATEWAY_OWNERS_K": "1",
            "LORAFLEET_PLACEMENT_REPLICA_CAPACITY_TOKENS_PER_S": str(capacity),
            # windows close late on a loaded machine: demand outlives a few of them
            "LORAFLEET_PLACEMENT_DEMAND_TTL_S": str(15 * cfg.window_s),
            "LORAFLEET_PLACEMENT_DECAY_CHECK_S": "1",
            "LORAFLEET_PLACEMENT_MERGE_TOKENS_PER_S": "1000000",  # no merged replica in this run
        },
    )


async def owners_of(stack: ScaleupStack, adapter_id: str) -> int:
    conn = await asyncpg.connect(stack.platform.database_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM placements WHERE adapter_id = $1 AND role = 'owner'", adapter_id
            )
        )
    finally:
        await conn.close()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def by_tenant(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each alias's request count, failures and TTFT p50/p95, plus the other tenants' pooled p95."""
    out: dict[str, Any] = {}
    for alias in ADAPTERS.values():
        mine = [r for r in records if r["model"] == alias]
        ttft = [r["ttft_s"] for r in mine if r["status"] == 200 and r["ttft_s"] >= 0]
        failed = sum(1 for r in mine if r["status"] != 200)
        p50, p95 = _pct(ttft, 0.5), _pct(ttft, 0.95)
        out[alias] = {"requests": len(mine), "failed": failed, "p50": p50, "p95": p95}
    others = [
        r["ttft_s"]
        for r in records
        if r["model"] != ADAPTERS[DOMINANT] and r["status"] == 200 and r["ttft_s"] >= 0
    ]
    out["others_p95"] = _pct(others, 0.95)
    return out


async def run_one(
    platform: PlatformSettings, work: Path, cfg: DominantConfig, follow: bool
) -> dict[str, Any]:
    async with scaleup_stack(platform, work, stack_config(cfg, follow)) as stack:
        for index in range(1, cfg.replicas):
            stack.start_replica(index)
        await wait_for(lambda: stack.all_ready(cfg.replicas), 240, "every replica ready", stack)
        lt = LoadTestConfig(
            gateway=stack.gateway_url,
            models=tuple(ADAPTERS.values()),
            keys=stack.keys,
            workload=WorkloadConfig(
                zipf_s=cfg.zipf,
                duration_s=cfg.duration_s,
                prompt_mean=cfg.prompt_mean,
                output_mean=cfg.output_mean,
                seed=cfg.seed,
            ),
        )
        owners: list[tuple[float, int]] = []
        t0 = time.monotonic()
        load = asyncio.create_task(
            asyncio.to_thread(run_loadtest, lt, [cfg.rate], work / "report", progress=False)
        )
        while not load.done():
            owners.append((round(time.monotonic() - t0, 1), await owners_of(stack, DOMINANT)))
            await asyncio.sleep(1.0)
        summary = await load
        records = [json.loads(line) for line in (work / "report" / "requests.jsonl").read_text().splitlines()]
        return {
            "owners_follow_traffic": follow,
            "dominant_owners_max": max((n for _t, n in owners), default=0),
            "dominant_owners_series": owners,
            "statuses": summary["rates"][0]["statuses"],
            "tenants": by_tenant(records),
        }


async def run_dominant(platform: PlatformSettings, work: Path, cfg: DominantConfig) -> dict[str, Any]:
    before = await run_one(platform, work / "before", cfg, follow=False)
    after = await run_one(platform, work / "after", cfg, follow=True)
    return {"config": cfg.__dict__, "before": before, "after": after}


def dominant(
    out_dir: Path = typer.Option(Path("bench/results"), help="writes dominant.json here"),
    rate: float = typer.Option(DominantConfig.rate, help="requests/s"),
    duration_s: float = typer.Option(DominantConfig.duration_s),
    zipf: float = typer.Option(DominantConfig.zipf),
    replicas: int = typer.Option(DominantConfig.replicas),
) -> None:
    """One dominant adapter, before and after owner counts follow traffic: JSON."""
    from bench._util import emit
    from lorafleet.config import get_settings

    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = DominantConfig(replicas=replicas, rate=rate, duration_s=duration_s, zipf=zipf)
    work = Path(tempfile.mkdtemp(prefix="lorafleet-dominant-"))
    result = asyncio.run(run_dominant(get_settings(), work, cfg))
    result["logs"] = str(work)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dominant.json").write_text(json.dumps(result, indent=1) + "\n")
    emit({k: v for k, v in result.items() if k != "logs"})
