"""Triton kernels for RMSNorm and RoPE: one launch each where torch runs four to six elementwise kernels.

Semantics (each equals the torch code in replica.kernels.norm_ops, up to fp32-vs-dtype rounding order):

    rms_norm:  out[i] = weight * (x[i].float() * rsqrt(mean(x[i].float() ** 2) + eps)).to(x.dtype)
    rope:      for each token i and head h of the first `heads` heads of x:
                   a, b = x[i, h, :half].float(), x[i, h, half:].float()
                   out[i, h, :half] = a * cos[i, :half] - b * sin[i, :half]
                   out[i, h, half:] = b * cos[i, half:] + a * sin[i, half:]

Shapes: x [num_tokens, hidden] for rms_norm (rows may be strided, last dim contiguous), weight [hidden];
x [num_tokens, >= heads, head_dim] for rope (any token and head stride, last dim contiguous), cos and sin
[num_tokens, head_dim] contiguous; out contiguous, in x's dtype. No host sync, shapes from x alone: both
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kernels.launch_checks import check_float, check_rows, check_same_device


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_tokens, hidden]
    w_ptr,  # [hidden]
    out_ptr,  # [num_tokens, hidden]
    hidden,
    stride_x,
    eps,
    BLOCK: tl.constexpr,
):
    # One program per token: the whole row in one block (hidden <= 16,384 in every Llama).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    normed = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded as torch's .to(dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    x_ptr,  # [num_tokens, >= heads, head_dim]
    cos_ptr,  # [num_tokens, head_dim]
    sin_ptr,  # [num_tokens, head_dim]
    out_ptr,  # [num_tokens, heads, head_dim]
    heads,
    stride_tok,
    stride_head,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # One program per (token, tile of heads): the token's cos and sin are read once for its heads.
    tok = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    d = tl.arange(0, HALF)  # [HALF]
    mask = (h < heads)[:, None]
    src = x_ptr + tok * stride_tok + h[:, None].to(tl.int64) * stride_head + d[None, :]  # [BLOCK_H, HALF]
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + tok * 2 * HALF + d).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + tok * 2 * HALF + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + tok * 2 * HALF + d).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + tok * 2 * HALF + HALF + d).to(tl.float32)[None, :]
    dst = out_ptr + (tok * heads + h[:, None].to(tl.int64)) * 2 * HALF + d[None, :]
    tl.store(dst, (a * c1 - b * s1).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (b * c2 + a * s2).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out [num_tokens, hidden] in x's dtype: RMSNorm of each row, one launch."""
    check_rows("x", x)
    check_float("x", x)
    check_same_device("weight", weight, x)
    num_tokens, hidden = x.shape
    if weight.shape != (hidden,):
        raise ValueError(f"weight must have shape [{hidden}], got {tuple(weight.shape)}")
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    if num_tokens:
        _rms_norm_kernel[(num_tokens,)](
            x, weight, out, hidden, x.stride(0), eps, BLOCK=triton.next_power_of_2(hidden)
        )
    return out


def rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """out [num_tokens, heads, head_dim]: the first `heads` heads of x rotated, one launch."""
    check_float("x", x)
    if x.dim() != 3 or x.stride(2) != 1 or x.shape[1] < heads:
        raise ValueError(
            f"x must be [num_tokens, >= {heads}, head_dim], last dim contiguous: {tuple(x.shape)}"
        )
    num_tokens, _, head_dim = x.shape
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_same_device(name, t, x)
        if tuple(t.shape) != (num_tokens, head_dim) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{num_tokens}, {head_dim}], got {tuple(t.shape)}")
    out = torch.empty(num_tokens, heads, head_dim, dtype=x.dtype, device=x.device)
    if num_tokens:
        block_h = min(16, triton.next_power_of_2(heads))
        grid = (num_tokens, triton.cdiv(heads, block_h))
        _rope_kernel[grid](
            x, cos, sin, out, heads, x.stride(0), x.stride(1), HALF=head_dim // 2, BLOCK_H=block_h
        )
    return out
