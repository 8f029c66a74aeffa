"""The training-time LoRA wrapper: a stack of adapters gives each one's rows what that adapter alone gives,
mixed ranks train exactly their own rank, and unwrapping puts the plain base back."""

from __future__ import annotations

import torch
from torch import nn

from demo.lora import LoraLinear, adapter_tensors, load_adapter, trainable, unwrap, wrap

IN, OUT = 12, 10


def _base() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(IN, OUT, bias=False).requires_grad_(False)


def _trained_like(w: LoraLinear) -> None:
    """Give B random values, as training would (B starts at zero)."""
    with torch.no_grad():
        w.b.copy_(torch.randn(w.b.shape, generator=torch.Generator().manual_seed(1)))


def test_each_adapter_of_a_stack_computes_the_plain_lora_formula_on_its_own_rows() -> None:
    ranks, alphas = [2, 4, 3], [4.0, 8.0, 3.0]
    gens = [torch.Generator().manual_seed(10 + n) for n in range(3)]
    w = LoraLinear(_base(), ranks, alphas, gens)
    _trained_like(w)
    x = torch.randn(3 * 2, 5, IN)  # [num_adapters * rows, seq, in]
    y = w(x)
    for n, (r, alpha) in enumerate(zip(ranks, alphas, strict=True)):
        a, b = w.adapter_weights(n)
        assert a.shape == (r, IN) and b.shape == (OUT, r)
        rows = x[2 * n : 2 * n + 2]
        expected = rows @ w.base.weight.T + (rows @ a.T) @ b.T * (alpha / r)
        torch.testing.assert_close(y[2 * n : 2 * n + 2], expected)


def test_an_adapters_start_depends_on_its_own_generator_only() -> None:
    alone = LoraLinear(_base(), [4], [8.0], [torch.Generator().manual_seed(7)])
    stacked = LoraLinear(
        _base(), [2, 4], [4.0, 8.0], [torch.Generator().manual_seed(3), torch.Generator().manual_seed(7)]
    )
    assert torch.equal(alone.adapter_weights(0)[0], stacked.adapter_weights(1)[0])
    assert not stacked.b.any()  # B starts at zero: every adapter begins as the unchanged base


def test_the_padding_of_a_smaller_rank_gets_no_gradient() -> None:
    w = LoraLinear(_base(), [2, 4], [4.0, 8.0], [torch.Generator().manual_seed(n) for n in range(2)])
    _trained_like(w)
    w(torch.randn(2, 3, IN)).square().sum().backward()
    assert w.a.grad is not None and w.b.grad is not None
    assert not w.a.grad[0, 2:].any() and not w.b.grad[0, :, 2:].any()
    assert w.a.grad[0, :2].any() and w.a.grad[1].any()
    assert not w.a[0, 2:].any()  # the padding starts at zero too


def test_wrap_swaps_the_chosen_linears_and_unwrap_puts_the_base_back() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2
    )
    layers = LlamaForCausalLM(config).model.layers
    q_before = layers[2].self_attn.q_proj
    gen = torch.Generator().manual_seed(0)
    wrappers = wrap(layers, [1, 2], ["down_proj", "q_proj"], [4], [8.0], [gen])
    assert sorted(wrappers) == [(1, "down_proj"), (1, "q_proj"), (2, "down_proj"), (2, "q_proj")]
    assert layers[2].self_attn.q_proj is wrappers[(2, "q_proj")] and layers[1].mlp.down_proj.base is not None
    assert not isinstance(layers[0].self_attn.q_proj, LoraLinear)
    assert len(trainable(wrappers)) == 2 * len(wrappers)
    tensors = adapter_tensors(wrappers, 0)
    assert tensors[(2, "q_proj")][0].shape == (4, 16) and tensors[(1, "down_proj")][1].shape == (16, 4)
    unwrap(layers, wrappers)
    assert layers[2].self_attn.q_proj is q_before
    again = wrap(layers, [1, 2], ["down_proj", "q_proj"], [2, 4], [4.0, 8.0], [gen, gen])
    load_adapter(again, 1, tensors)  # another version starts from this adapter's trained weights
    assert all(torch.equal(adapter_tensors(again, 1)[k][i], tensors[k][i]) for k in tensors for i in (0, 1))
    unwrap(layers, again)
    assert not any(isinstance(m, LoraLinear) for m in layers.modules())
