"""The assembled replica: merged equals unmerged, and a request pulls its adapter through the cache tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

from replica.config import ReplicaSettings
from replica.engine.sampler import SamplingParams
from replica.errors import AdapterNotServedError
from replica.runtime import Replica, build_replica
from tests.replica.peft_util import TEST_BASE_HASH, AdapterRecipe, make_peft_adapters


async def _tokens(replica: Replica, adapter_id: str | None) -> list[int]:
    use = await replica.acquire(adapter_id)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    try:
        gen = replica.engine.generate([3, 1, 4, 1, 5, 9], params, use.engine_adapter_id)
        return [o.token_id async for o in gen]
    finally:
        replica.release(use)


async def test_merged_replica_equals_unmerged(tiny_model_dir: Path, tmp_path: Path) -> None:
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path, [AdapterRecipe("heavy", 16, 32, seed=5)], std=0.3)
    common = dict(
        model_dir=tiny_model_dir,
        device="cpu",
        base_model_hash=TEST_BASE_HASH,
        max_num_seqs=2,
        max_model_len=64,
        adapter_dirs={"heavy": dirs["heavy"]},
        lora_slots={16: 1},
        registry_url=None,
        control_enabled=False,
    )
    unmerged = build_replica(ReplicaSettings(**common, cache_dir=tmp_path / "cache"))
    merged = build_replica(ReplicaSettings(**common, merged_adapter_id="heavy"))
    for r in (unmerged, merged):
        await r.start()
    try:
        with pytest.raises(AdapterNotServedError, match="not merged yet"):
            await merged.acquire("heavy")
        await merged.merge()
        base = await _tokens(unmerged, None)
        assert await _tokens(merged, "heavy") == await _tokens(unmerged, "heavy") != base
        with pytest.raises(AdapterNotServedError):
            await merged.acquire(None)
        assert merged.state().gpu_adapters == ["heavy"]
        assert merged.state().merged_adapter_id == "heavy"
        assert unmerged.state().merged_adapter_id is None
    finally:
        for r in (unmerged, merged):
            await r.stop()


async def test_a_request_pulls_its_adapter_through_the_tiers_and_holds_it_until_released(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path, [AdapterRecipe("a1", 8, 16, seed=2)])
    settings = ReplicaSettings(
        model_dir=tiny_model_dir,
        device="cpu",
        base_model_hash=TEST_BASE_HASH,
        max_num_seqs=2,
        max_model_len=64,
        adapter_dirs={"a1": dirs["a1"]},
        lora_slots={8: 1},
        registry_url=None,
        control_enabled=False,
        cache_dir=tmp_path / "cache",
    )
    replica = build_replica(settings)
    await replica.start()
    try:
        use = await replica.acquire("a1")
        assert use.tier == "remote" and replica.cache is not None
        assert replica.cache.gpu.ref_count("a1") == 1
        await replica.cache.settle()  # the disk copy is written behind the slot load
        state = replica.state()
        assert "a1" in state.gpu_adapters and "a1" in state.ram_adapters and "a1" in state.disk_adapters
        replica.release(use)
        replica.release(use)  # idempotent: a second release must not unpin another request's hold
        assert replica.cache.gpu.ref_count("a1") == 0
        again = await replica.acquire("a1")
        assert again.tier == "gpu"
        replica.release(again)
    finally:
        await replica.stop()
