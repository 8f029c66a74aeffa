"""GET /metrics on a tiny replica: vLLM's names and labels, and our adapter counters move with requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lorafleet.model.base_hash import base_model_hash
from replica.adapter_cache.tier import CacheEvent
from replica.config import ReplicaSettings
from replica.engine.sampler import SamplingParams
from replica.engine.scheduler import CacheCounters
from replica.engine.sequence import Sequence
from replica.kv.blocks import BlockManager
from replica.metrics import ReplicaMetrics, engine_load
from replica.runtime import AdapterUse, Replica, build_replica
from replica.server import create_app
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/internal/replicas/r1"


@pytest.fixture(scope="module")
async def replica(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replica]:
    out = tmp_path_factory.mktemp("metrics-adapters")
    recipes = [AdapterRecipe("tiny-a", 8, 16, targets=("q_proj", "v_proj"), seed=1)]
    _, dirs = make_peft_adapters(tiny_model_dir, out, recipes, base_hash=base_model_hash(tiny_model_dir))
    settings = ReplicaSettings(
        replica_id="r1",
        service_token=TOKEN,
        model_dir=tiny_model_dir,
        device="cpu",
        max_num_seqs=4,
        max_model_len=128,
        lora_slots={8: 2},
        adapter_dirs={"tiny-a": dirs["tiny-a"]},
        registry_url=None,
        control_enabled=False,
        cache_dir=out / "cache",
    )
    rep = build_replica(settings)
    await rep.start()
    yield rep
    await rep.stop()


@pytest.fixture
async def client(replica: Replica) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        yield c


async def _scrape(client: httpx.AsyncClient) -> dict[str, list]:
    resp = await client.get("/metrics")  # no service token: Prometheus scrapes it as it scrapes vLLM
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(resp.text)}


def _value(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


async def test_a_generation_moves_the_vllm_and_lorafleet_metrics(
    client: httpx.AsyncClient, tiny_model_dir: Path
) -> None:
    before = await _scrape(client)
    body = {"prompt_token_ids": [1, 2, 3, 4, 5], "max_tokens": 6, "ignore_eos": True, "adapter_id": "tiny-a"}
    resp = await client.post(f"{BASE}/generate", json=body, headers=AUTH)
    assert resp.status_code == 200 and resp.headers["x-adapter-tier"] == "remote"
    after = await _scrape(client)

    ttft = "vllm:time_to_first_token_seconds"
    itl = "vllm:inter_token_latency_seconds"
    count = lambda fams, fam, name: _value(fams.get(fam, []), name)  # noqa: E731
    assert count(after, ttft, ttft + "_count") == count(before, ttft, ttft + "_count") + 1
    assert count(after, itl, itl + "_count") == count(before, itl, itl + "_count") + 5  # 6 tokens, 5 gaps
    gen = "vllm:generation_tokens"
    assert count(after, gen, gen + "_total") - count(before, gen, gen + "_total") == 6
    hits = after["lorafleet_replica_adapter_hits"]
    assert _value(hits, "lorafleet_replica_adapter_hits_total", tier="remote") >= 1
    loads = after["lorafleet_replica_adapter_loads"]
    assert _value(loads, "lorafleet_replica_adapter_loads_total", from_tier="ram", to_tier="gpu") >= 1
    assert {s.labels["model_name"] for s in after[ttft]} == {tiny_model_dir.name}


async def test_engine_gauges_have_the_vllm_names_and_lora_info_labels(client: httpx.AsyncClient) -> None:
    fams = await _scrape(client)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "lorafleet_replica_tokens_in_flight",
    ):
        (sample,) = fams[name]
        assert sample.value == 0 and "model_name" in sample.labels  # idle between requests
    staged = {s.labels["outcome"]: s.value for s in fams["lorafleet_replica_decode_staged_ahead"]}
    assert staged == {"used": 0, "missed": 0}  # the CPU stages nothing ahead
    (info,) = fams["vllm:lora_requests_info"]
    assert info.labels == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert info.value > 1e9  # the update time, as vLLM sets it


def test_engine_load_lists_running_and_waiting_adapters_and_kv_usage() -> None:
    params = SamplingParams(max_tokens=4)
    run = [Sequence("a", [1, 2, 3], params, "x"), Sequence("b", [1] * 5, params, None)]
    run[0].output_token_ids = [7, 8]
    run[0].num_cached = 4  # decoding: its newest token is the one uncomputed
    run[1].num_cached = 2  # a chunk of its prompt prefilled, three tokens to go
    wait = [Sequence("c", [1] * 4, params, "y"), Sequence("d", [1], params, "x")]
    blocks = BlockManager(8, 4)
    assert blocks.allocate("a", 5) and blocks.allocate("b", 5)  # four of eight blocks held
    staging = {"ahead_used": 9, "ahead_missed": 2, "rows_rebuilt": 5}
    load = engine_load(run, wait, blocks, CacheCounters(queries=40, hits=16, preemptions=1), staging)
    assert (load.staged_ahead_used, load.staged_ahead_missed) == (9, 2)
    assert (load.running, load.waiting) == (2, 2)
    assert load.kv_usage == pytest.approx(0.5) and (load.kv_blocks, load.block_size) == (8, 4)
    assert (load.prefix_cache_queries, load.prefix_cache_hits, load.preemptions) == (40, 16, 1)
    assert load.tokens_in_flight == 10 + 5
    assert load.prefill_tokens == 3 + 4 + 1
    assert load.running_adapters == ("x",) and load.waiting_adapters == ("x", "y")


def test_cache_events_count_loads_by_tiers_and_evictions_by_tier() -> None:
    m = ReplicaMetrics("base")
    m.cache_event(CacheEvent("load", "a", "disk", "ram", 0.1, 10))
    m.cache_event(CacheEvent("evict", "b", "gpu", "ram", 0.0, 0))
    m.cache_event(CacheEvent("evict", "c", "gpu", None, 0.0, 0))
    get = m.registry.get_sample_value
    assert get("lorafleet_replica_adapter_loads_total", {"from_tier": "disk", "to_tier": "ram"}) == 1
    assert get("lorafleet_replica_adapter_evictions_total", {"tier": "gpu"}) == 2


def test_two_replicas_metrics_do_not_collide() -> None:
    a, b = ReplicaMetrics("m"), ReplicaMetrics("m")
    a.hit("gpu")
    assert a.registry.get_sample_value("lorafleet_replica_adapter_hits_total", {"tier": "gpu"}) == 1
    assert b.registry.get_sample_value("lorafleet_replica_adapter_hits_total", {"tier": "gpu"}) is None


async def test_holds_gauge_shows_a_pinned_slot_and_returns_to_zero_on_release(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    holds = "lorafleet_replica_holds"
    idle = {s.labels["kind"]: s.value for s in (await _scrape(client))[holds]}
    assert idle == dict.fromkeys(replica.holds(), 0) and "slot_refs" in idle
    use = await replica.acquire("tiny-a")
    try:
        pinned = (await _scrape(client))[holds]
        assert _value(pinned, holds, kind="slot_refs") == 1
    finally:
        replica.release(use)
    assert _value((await _scrape(client))[holds], holds, kind="slot_refs") == 0


async def _generate(client: httpx.AsyncClient, prompt: list[int], **extra: object) -> dict:
    body = {"prompt_token_ids": prompt, "max_tokens": 2, "ignore_eos": True, "adapter_id": "tiny-a", **extra}
    resp = await client.post(f"{BASE}/generate", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return json.loads(resp.text.splitlines()[-1])


async def test_prefix_cache_hits_reach_the_usage_the_metrics_and_the_state(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    prompt = [(5 * i) % 200 + 7 for i in range(40)]  # two full blocks of 16 and 8 tokens
    before = await _scrape(client)
    first = await _generate(client, prompt)
    again = await _generate(client, prompt)
    salted = await _generate(client, prompt, cache_salt="end-user-1")
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert salted["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    after = await _scrape(client)
    gained = lambda name: _value(after[name], name + "_total") - _value(before.get(name, []), name + "_total")  # noqa: E731
    assert gained("vllm:prefix_cache_queries") == 120 and gained("vllm:prefix_cache_hits") == 32
    (config,) = after["vllm:cache_config_info"]
    assert config.labels["block_size"] == "16" and int(config.labels["num_gpu_blocks"]) > 0
    state = replica.replica_state()
    assert state.prefix_cache_hits >= 32 and state.prefix_cache_queries >= 120 and state.kv_usage == 0.0
    # the batch it reports, idle now: the router's test for room (docs/routing.md)
    assert (state.running, state.queue_depth, state.max_running, state.prefill_tokens) == (0, 0, 4, 0)


async def test_a_request_waiting_for_its_adapter_counts_in_the_reported_batch(
    client: httpx.AsyncClient, replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose adapter is still loading is in no engine queue yet, but it waits all the same: the
    state counts it, so a gateway does not take its replica for one with room."""
    entered, go = asyncio.Event(), asyncio.Event()
    acquire = replica.acquire

    async def slow_acquire(adapter_id: str | None, tenant_id: str | None = None) -> AdapterUse:
        entered.set()
        await go.wait()
        return await acquire(adapter_id, tenant_id)

    monkeypatch.setattr(replica, "acquire", slow_acquire)
    request = asyncio.create_task(_generate(client, [9] * 20))
    await asyncio.wait_for(entered.wait(), 10)
    state = replica.replica_state()
    assert (state.queue_depth, state.prefill_tokens, state.tokens_in_flight) == (1, 20, 20)
    go.set()
    await request
    state = replica.replica_state()
    assert (state.queue_depth, state.prefill_tokens, state.running) == (0, 0, 0)
