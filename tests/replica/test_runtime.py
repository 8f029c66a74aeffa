"""A merged replica gives the same greedy tokens as an unmerged one serving the same adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from replica.config import ReplicaSettings
from replica.engine.sampler import SamplingParams
from replica.errors import AdapterNotServedError
from replica.runtime import Replica, build_replica
from tests.replica.peft_util import TEST_BASE_HASH, AdapterRecipe, make_peft_adapters


async def _tokens(replica: Replica, adapter_id: str | None) -> list[int]:
    use = replica.prepare_adapter(adapter_id)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    return [
        o.token_id async for o in replica.engine.generate([3, 1, 4, 1, 5, 9], params, use.engine_adapter_id)
    ]


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
    )
    unmerged = build_replica(ReplicaSettings(**common))
    merged = build_replica(ReplicaSettings(**common, merged_adapter_id="heavy"))
    for r in (unmerged, merged):
        r.engine.start()
    try:
        base = await _tokens(unmerged, None)
        assert await _tokens(merged, "heavy") == await _tokens(unmerged, "heavy") != base
        with pytest.raises(AdapterNotServedError):
            merged.prepare_adapter(None)
        assert merged.state()["gpu_adapters"] == ["heavy"]
    finally:
        for r in (unmerged, merged):
            r.engine.stop()
