"""rsLoRA and per-module rank_pattern / alpha_pattern, served through the replica's production load path
(object store -> validation -> RAM -> GPU slot, AdapterCache with GpuTier), match PEFT's own forward."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.record import AdapterRecord
from replica.engine.model_runner import ModelRunner, StepInput
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.loader import load_model
from tests.replica.adapter_cache.helpers import DictRegistry
from tests.replica.peft_util import ALL_TARGETS, TEST_BASE_HASH, AdapterRecipe, make_peft_adapters

RECIPES = [
    AdapterRecipe(  # rsLoRA with both patterns: ranks 8, 4 and 12 in the rank-16 bucket
        "rs_patterns",
        8,
        16,
        use_rslora=True,
        seed=1,
        rank_pattern=(("v_proj", 4), ("layers.1.mlp.down_proj", 12)),
        alpha_pattern=(("q_proj", 40.0), ("layers.0.self_attn.o_proj", 3.0)),
    ),
    AdapterRecipe(  # plain scaling, a regex-like key, targets a subset
        "patterns",
        4,
        8,
        targets=("q_proj", "k_proj", "gate_proj", "down_proj"),
        seed=2,
        rank_pattern=(("layers.[01].self_attn.k_proj", 2),),
        alpha_pattern=(("mlp.gate_proj", 24.0),),
    ),
    AdapterRecipe("rs_plain", 16, 8, use_rslora=True, seed=3),
]
CAPACITIES = {8: 2, 16: 2}


def _peft_scalings(peft_model, name: str) -> dict[tuple[int, str], tuple[int, float]]:
    """(layer, module) -> (rank, scale) as PEFT set them up for this adapter."""
    out = {}
    for path, module in peft_model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and name in scaling:
            parts = path.split(".")
            layer = int(parts[parts.index("layers") + 1])
            out[(layer, parts[-1])] = (module.r[name], scaling[name])
    return out


async def test_rslora_and_patterns_served_from_the_cache_match_peft(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    peft_model, dirs = make_peft_adapters(tiny_model_dir, tmp_path / "store", RECIPES)
    model = load_model(tiny_model_dir, "float32", "cpu")
    spec = AdapterSpec.for_model(model.config, ALL_TARGETS, 64, TEST_BASE_HASH)
    layers = apply_lora(model, ALL_TARGETS, CAPACITIES)
    registry = DictRegistry()
    for rec in RECIPES:
        digest = hashlib.sha256((dirs[rec.name] / "adapter_model.safetensors").read_bytes()).hexdigest()
        registry.records[rec.name] = AdapterRecord(
            rec.name, f"file://{dirs[rec.name]}", digest, TEST_BASE_HASH, tuple(rec.targets)
        )
    cache = AdapterCache(
        spec,
        registry,
        ObjectStore(None, file_roots=[tmp_path / "store"]),
        DiskTier(tmp_path / "disk", 1 << 30),
        HostTier(1 << 30),
        GpuTier(layers, CAPACITIES),
    )
    leases = {rec.name: await cache.acquire(rec.name) for rec in RECIPES}
    try:
        for rec in RECIPES:  # each slot holds PEFT's own per-module rank (padded) and scale
            ref = leases[rec.name].ref
            want = _peft_scalings(peft_model, rec.name)
            assert len({r for r, _ in want.values()}) > 1 or not rec.rank_pattern
            for (layer, name), lin in layers.items():
                got = float(lin.pools[ref.bucket].scale[ref.index])
                rank, scale = want.get((layer, name), (0, 0.0))
                assert abs(got - scale) <= 1e-6 * max(1.0, scale), (rec.name, layer, name, got, scale)
                a = lin.pools[ref.bucket].a[ref.index]  # [bucket, in_features]
                assert a[rank:].abs().sum() == 0 and (rank == 0 or a[:rank].abs().sum() > 0)
        gen = torch.Generator().manual_seed(5)
        names: list[str | None] = [r.name for r in RECIPES] + [None]
        ids = [torch.randint(0, 320, (9 + 4 * i,), generator=gen).tolist() for i in range(len(names))]
        runner = ModelRunner(model, max_num_seqs=8, max_model_len=128)
        steps = [
            StepInput(ids[i], 0, runner.row_table(i), slot=leases[n].ref if n else None)
            for i, n in enumerate(names)
        ]
        ours = runner.run(steps, all_logits=True)  # [num_tokens, vocab], one packed batch
        offset = 0
        for i, name in enumerate(names):
            with torch.no_grad():
                if name is None:
                    with peft_model.disable_adapter():
                        ref_logits = peft_model(torch.tensor([ids[i]])).logits[0]
                else:
                    peft_model.set_adapter(name)
                    ref_logits = peft_model(torch.tensor([ids[i]])).logits[0]
                    with peft_model.disable_adapter():
                        base = peft_model(torch.tensor([ids[i]])).logits[0]
                    assert (base - ref_logits).abs().max() > 1e-2  # the adapter changes the output
            n = len(ids[i])
            torch.testing.assert_close(
                ours[offset : offset + n], ref_logits.float(), atol=1e-4, rtol=1e-4, msg=str(name)
            )
            offset += n
    finally:
        for lease in leases.values():
            cache.release(lease)
        await cache.settle()
