"""Unmerged multi-LoRA logits (a packed prefill, then one decode step) equal transformers + PEFT and equal
our merged mode.

The unmerged adapters reach their slots through the adapter cache (validation, packing, the GpuTier write);
the merged ones through read_adapter, as a merged replica reads its adapter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replica.engine.model_runner import ModelRunner, StepInput
from replica.lora.merge import merge_adapter
from replica.lora.spec import MODULE_PARENTS
from replica.lora.weights import read_adapter
from replica.model.loader import load_model
from tests.replica.cache_util import local_cache, own_in_slots
from tests.replica.peft_util import AdapterRecipe, build_lora_model, make_peft_adapters

RECIPES = [
    AdapterRecipe("r8", 8, 16, seed=1),
    AdapterRecipe("r12", 12, 24, targets=("q_proj", "v_proj", "down_proj"), seed=2),  # padded into 16
    AdapterRecipe("r16rs", 16, 8, use_rslora=True, seed=3),
    AdapterRecipe("r32", 32, 32, targets=("k_proj", "o_proj", "gate_proj", "up_proj"), seed=4),
]
CAPACITIES = {8: 2, 16: 2, 32: 2}


def _module_path(key: tuple[int, str]) -> str:
    layer, name = key
    return f"model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"


async def _check_parity(base_dir: Path, tmp_path: Path, ids: list[list[int]], atol: float) -> None:
    peft_model, dirs = make_peft_adapters(base_dir, tmp_path / "adapters", RECIPES)
    model, gpu, spec = build_lora_model(base_dir, CAPACITIES)
    await own_in_slots(local_cache(spec, gpu, dirs, tmp_path / "cache"), list(dirs))
    runner = ModelRunner(model, max_num_seqs=8, max_model_len=256)
    # one packed batch: every adapter plus a base-only row, prompts of different lengths
    names: list[str | None] = [r.name for r in RECIPES] + [None]
    steps = [
        StepInput(ids[i], 0, runner.row_table(i), slot=gpu.acquire(n) if n else None)
        for i, n in enumerate(names)
    ]
    ours = runner.run(steps, all_logits=True)  # [num_tokens, vocab]
    merged = load_model(base_dir, "float32", "cpu")  # one copy, restored after each adapter is folded in
    offset = 0
    for i, name in enumerate(names):
        n = len(ids[i])
        with torch.no_grad():
            if name is None:
                with peft_model.disable_adapter():
                    ref = peft_model(torch.tensor([ids[i]])).logits[0]
            else:
                peft_model.set_adapter(name)
                ref = peft_model(torch.tensor([ids[i]])).logits[0]
        torch.testing.assert_close(
            ours[offset : offset + n], ref.float(), atol=atol, rtol=1e-4, msg=f"row {name}"
        )
        if name is not None:  # the adapter really changes the output, so the test can fail
            with peft_model.disable_adapter(), torch.no_grad():
                base = peft_model(torch.tensor([ids[i]])).logits[0]
            assert (base - ref).abs().max() > 100 * atol
            weights = read_adapter(dirs[name], name, spec)
            touched = [merged.get_submodule(_module_path(key)).weight for key in weights.modules]
            original = [w.clone() for w in touched]
            merge_adapter(merged, weights)
            with torch.no_grad():
                m = merged.compute_logits(merged(torch.tensor(ids[i]), torch.arange(n)))
                for w, orig in zip(touched, original, strict=True):
                    w.copy_(orig)
            torch.testing.assert_close(
                m, ours[offset : offset + n], atol=atol, rtol=1e-4, msg=f"merged {name}"
            )
        offset += n
    await _check_decode_step(runner, peft_model, steps, ours, ids, names, atol)


async def _check_decode_step(
    runner: ModelRunner, peft_model, steps: list[StepInput], prefilled: torch.Tensor, ids, names, atol: float
) -> None:
    """One decode step over every row at once (the static decode buffers, every rank bucket plus a base
    row) equals PEFT on the prompt plus that token."""
    ends = torch.tensor([len(x) for x in ids]).cumsum(0) - 1
    nxt = prefilled[ends].argmax(-1).tolist()  # each row's greedy next token
    decode = [StepInput([t], len(x), s.block_table, s.slot) for t, x, s in zip(nxt, ids, steps, strict=True)]
    logits = runner.run(decode)  # [rows, vocab]
    assert logits.shape[0] == len(decode)
    for i, name in enumerate(names):
        with torch.no_grad():
            if name is None:
                with peft_model.disable_adapter():
                    ref = peft_model(torch.tensor([ids[i] + [nxt[i]]])).logits[0, -1]
            else:
                peft_model.set_adapter(name)
                ref = peft_model(torch.tensor([ids[i] + [nxt[i]]])).logits[0, -1]
        torch.testing.assert_close(logits[i], ref.float(), atol=atol, rtol=1e-4, msg=f"decode row {name}")


async def test_tiny_unmerged_matches_peft_and_merged(tiny_model_dir: Path, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    ids = [torch.randint(0, 320, (12 + 5 * i,), generator=gen).tolist() for i in range(len(RECIPES) + 1)]
    await _check_parity(tiny_model_dir, tmp_path, ids, atol=1e-4)


@pytest.mark.slow
async def test_smollm2_unmerged_matches_peft_and_merged(smollm2_dir: Path, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(8)
    ids = [torch.randint(0, 49152, (8 + 3 * i,), generator=gen).tolist() for i in range(len(RECIPES) + 1)]
    await _check_parity(smollm2_dir, tmp_path, ids, atol=3e-4)
