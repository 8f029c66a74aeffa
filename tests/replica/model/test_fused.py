"""Fused projections: one GEMM for q/k/v and for gate/up, same outputs, weights stored once."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from replica.model.fused import fuse_projections
from replica.model.loader import load_model


def test_the_loader_fuses_and_each_projection_is_a_view_of_the_fused_weight(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, "float32", "cpu")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_proj is not None and mlp.gate_up_proj is not None
    fused = attn.qkv_proj.weight
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.weight.shape[0] :].data_ptr()
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)  # counted once
    with torch.no_grad():
        attn.v_proj.weight.add_(1.0)  # an in-place edit by name (a merged adapter) lands in the GEMM's weight
    assert torch.equal(fused[-attn.v_proj.weight.shape[0] :], attn.v_proj.weight)


def test_fused_forward_equals_the_separate_projections(tiny_model_dir: Path) -> None:
    fused = load_model(tiny_model_dir, "float32", "cpu")
    plain = copy.deepcopy(fused)
    for layer in plain.model.layers:  # the same weights, projected one GEMM each
        for parent, name in ((layer.self_attn, "qkv_proj"), (layer.mlp, "gate_up_proj")):
            setattr(parent, name, None)
    ids = torch.randint(0, fused.config.vocab_size, (17,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = fused.compute_logits(fused(ids, torch.arange(17)))
        b = plain.compute_logits(plain(ids, torch.arange(17)))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    fuse_projections(plain)  # fusing again, from the views, gives the same model
    with torch.no_grad():
        torch.testing.assert_close(
            plain.compute_logits(plain(ids, torch.arange(17))), a, atol=1e-5, rtol=1e-5
        )


def test_moving_the_model_keeps_each_projection_a_view_of_the_fused_weight(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, "float32", "cpu").to(torch.float64)
    attn = model.model.layers[1].self_attn
    assert attn.qkv_proj is not None and attn.q_proj.weight.dtype == torch.float64
    assert attn.q_proj.weight.data_ptr() == attn.qkv_proj.weight.data_ptr()
    with torch.no_grad():
        attn.q_proj.weight.zero_()  # an edit by name still reaches the fused GEMM
    assert torch.all(attn.qkv_proj.weight[: attn.q_proj.weight.shape[0]] == 0)
