"""`lorafleet loadtest` against the real online path: the public gateway, two SmolLM2 replicas with real
PEFT adapters (the e2e harness of gateway_stack), PostgreSQL and Kafka. A small run: two rates of a few
seconds over four adapters, then the distinct-adapter bursts, pre-warmed through the replicas' load API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from matplotlib.image import imread

from harness.adapters import make_peft_adapters
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from harness.stacks.gateway import ADAPTERS, TOKEN, GatewayStack, gateway_stack
from loadtest.burst import BurstConfig
from loadtest.cli import run_loadtest
from loadtest.runner import LoadTestConfig
from lorafleet.model.prepare import ensure_default_model
from sim.workload import WorkloadConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXTRA = {"acme-lt-a": "acme/lt-a:prod", "acme-lt-b": "acme/lt-b:prod", "acme-support-v2": "acme/lt-v2:prod"}
MODELS = ("acme/support:prod", *EXTRA.values())  # four acme adapters: acme's limits fit a burst


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    from lorafleet.model.base_hash import base_model_hash

    model_dir = ensure_default_model()
    base_hash = base_model_hash(model_dir)
    root = tmp_path_factory.mktemp("adapters")
    names = [*ADAPTERS, "acme-lt-a", "acme-lt-b"]  # the replicas register every folder under root at start
    await asyncio.to_thread(make_peft_adapters, model_dir, root, names, base_hash)
    async with gateway_stack(services.settings(), root, base_hash, tmp_path_factory.mktemp("gw")) as s:
        pool = await asyncpg.create_pool(s.database_url, min_size=1, max_size=1)
        try:
            new = [ReadyAdapter(aid, "acme", base_hash) for aid in ("acme-lt-a", "acme-lt-b")]
            await insert_ready_adapters(pool, new)
            for aid, alias in EXTRA.items():
                await insert_alias(pool, alias, "acme", aid)
        finally:
            await pool.close()
        yield s


async def test_loadtest_report_from_the_real_stack(stack: GatewayStack, tmp_path: Path) -> None:
    workload = WorkloadConfig(duration_s=4.0, prompt_mean=12, output_mean=4, zipf_s=1.0, seed=3)
    cfg = LoadTestConfig(stack.url, MODELS, stack.keys, workload, timeout_s=60.0, temperature=0.0)
    replicas = {rid: r.url for rid, r in stack.replicas.items()}
    burst = BurstConfig((1, 4), size=4, max_tokens=4, repeats=1, replica_token=TOKEN, settle_s=1.0)
    summary = await asyncio.to_thread(run_loadtest, cfg, [1.0, 2.0], tmp_path, False, replicas, None, burst)

    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == sum(s["requests"] for s in summary["rates"]) >= 6
    for rec in records:
        assert rec["status"] == 200, rec
        assert rec["tier"] in {"gpu", "ram", "disk", "remote"}
        assert rec["adapter_id"] in {*ADAPTERS, *EXTRA}
        assert 0 < rec["ttft_s"] <= rec["total_s"]
        assert 1 <= rec["usage_completion_tokens"] <= rec["max_tokens"]
    for s in summary["rates"]:
        assert s["ok"] == s["requests"] and s["statuses"] == {"200": s["requests"]}
        assert s["ttft"]["p50_s"] > 0 and sum(s["tier_share"].values()) == pytest.approx(1.0, abs=1e-3)
        assert set(s["replica_cache_per_min"]) == set(replicas)

    assert set(summary["burst"]["tokens_per_s"]) == {"1", "4"}
    for runs in summary["burst"]["runs"].values():
        for run in runs:
            assert run["ok"] == 4 and run["output_tokens"] >= 4 and run["tokens_per_s"] > 0
            assert run["tiers"] == {"gpu": 4}  # pre-warmed: every burst request found its adapter in a slot

    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    report = (tmp_path / "report.md").read_text()
    assert "| 1 |" in report and "| 2 |" in report and "Distinct adapters in a burst" in report
    for png in summary["plots"]:
        assert f"]({png})" in report and imread(tmp_path / png).shape[:2] == (400, 640)
    assert {"ttft.png", "tpot.png", "hit_rates.png", "cache_per_min.png", "burst.png"} <= set(
        summary["plots"]
    )
