"""The RMSNorm and RoPE kernels (Triton, interpreted on CPU) equal the torch ops the model runs elsewhere."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton; conftest.py sets it too

import pytest  # noqa: E402
import torch  # noqa: E402

from replica.kernels import norm_ops  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 72])
def test_rms_norm_kernel_equals_torch(dtype: torch.dtype, hidden: int) -> None:
    from replica.kernels.norm_rope import rms_norm

    gen = torch.Generator().manual_seed(0)
    wide = (torch.randn(5, hidden + 8, generator=gen) * 3).to(dtype)
    x = wide[:, 4 : 4 + hidden]  # a strided row view
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    got = rms_norm(x, weight, 1e-5)
    want = norm_ops.rms_norm_torch(x, weight, 1e-5)
    assert got.dtype == dtype and got.shape == want.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kernel_rotates_the_first_heads_of_a_fused_qkv(dtype: torch.dtype) -> None:
    from replica.kernels.norm_rope import rope

    gen = torch.Generator().manual_seed(1)
    n, heads, kv, hd = 7, 4, 2, 16
    qkv = (
        torch.randn(n, (heads + 2 * kv) * hd + 3, generator=gen).to(dtype)[:, 3:].view(n, heads + 2 * kv, hd)
    )
    angles = torch.rand(n, hd // 2, generator=gen) * 6
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    got = rope(qkv, heads + kv, cos, sin)
    want = norm_ops.rope_torch(qkv, heads + kv, cos, sin)
    assert got.shape == (n, heads + kv, hd) and got.is_contiguous()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="cos"):
        rope(qkv, heads, cos[:, :4].contiguous(), sin)


def test_the_model_gives_the_same_logits_with_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from replica.kernels.norm_rope import rms_norm, rope
    from replica.model.fused import fuse_projections
    from replica.model.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig.from_dict(dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=3, num_key_value_heads=1, head_dim=16))  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    fuse_projections(model)
    ids, positions = torch.randint(0, 64, (9,)), torch.arange(9)
    with torch.no_grad():
        want = model.compute_logits(model(ids, positions))
        monkeypatch.setitem(norm_ops.IMPLEMENTATIONS, "triton", (rms_norm, rope))
        monkeypatch.setitem(norm_ops.DEVICE_IMPLEMENTATION, "cpu", "triton")
        got = model.compute_logits(model(ids, positions))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
