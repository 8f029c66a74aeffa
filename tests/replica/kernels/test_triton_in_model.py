"""The Triton kernels (interpreted) inside the real LoRA-wrapped Llama give the torch path's logits."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from replica.engine.model_runner import ModelRunner, StepInput
from replica.kernels import ops
from replica.lora.replace import apply_lora
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaConfig, LlamaForCausalLM

TINY = dict(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, model_type="llama")  # fmt: skip
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_runner() -> ModelRunner:
    """A 2-layer Llama with every linear wrapped: 4 rank-8 slots and 2 rank-16 slots of random adapters."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_dict(TINY)).eval()
    wrappers = apply_lora(model, TARGETS, {8: 4, 16: 2})
    with torch.no_grad():
        for wrapper in wrappers.values():
            for pool in wrapper.pools.values():
                pool.a.normal_(0.0, 0.2)
                pool.b.normal_(0.0, 0.2)
                pool.scale.uniform_(0.5, 2.0)
    return ModelRunner(model, max_num_seqs=4, max_model_len=16)


def run_steps(runner: ModelRunner) -> list[torch.Tensor]:
    """A prefill of four prompts on mixed slots, then two decode steps; returns each step's logits."""
    slots = [SlotRef(8, 1), None, SlotRef(16, 0), SlotRef(8, 3)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    logits = [runner.run([StepInput(p, 0, runner.row_table(i), slots[i]) for i, p in enumerate(prompts)])]
    for step in range(2):
        decode = [
            StepInput([20 + i], len(p) + step, runner.row_table(i), slots[i]) for i, p in enumerate(prompts)
        ]
        logits.append(runner.run(decode))
    return logits


def test_model_logits_match_torch_path_when_kernels_run_in_the_layers(
    triton_ops: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = tiny_runner()
    expected = run_steps(runner)
    # select the Triton implementation for CPU tensors from ops' own table (Triton's interpreter runs it)
    triton = (triton_ops.lora_shrink, triton_ops.lora_expand, ops._triton_prepare)
    monkeypatch.setitem(ops.IMPLEMENTATIONS, "triton", triton)
    monkeypatch.setitem(ops.DEVICE_IMPLEMENTATION, "cpu", "triton")
    got = run_steps(runner)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_one_launch_over_every_bucket_gives_the_torch_paths_logits(
    triton_ops: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replica.kernels import lora_multi

    runner = tiny_runner()
    expected = run_steps(runner)
    calls: list[int] = []

    def counted_shrink(*args: object) -> torch.Tensor:
        calls.append(1)
        return lora_multi.shrink_multi(*args)  # type: ignore[arg-type]

    triton = (triton_ops.lora_shrink, triton_ops.lora_expand, ops._triton_prepare)
    monkeypatch.setitem(ops.IMPLEMENTATIONS, "triton", triton)
    monkeypatch.setitem(
        ops.ONE_LAUNCH, "triton", (lora_multi.bucket_table, counted_shrink, lora_multi.expand_multi)
    )
    monkeypatch.setitem(ops.DEVICE_IMPLEMENTATION, "cpu", "triton")
    got = run_steps(runner)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    # two decode steps, each one shrink per adapted projection (7 per layer, 2 layers), buckets 8 and 16 both in
    assert len(calls) == 2 * 7 * 2
