"""RMSNorm and RoPE as the model calls them: one Triton launch each on CUDA (replica.kernels.norm_rope),
torch ops elsewhere; both keep norm_rope's semantics."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
RopeFn = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [num_tokens, hidden] normalised in fp32, scaled by weight in x's dtype."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:  # the same product, in one operator
        return torch.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_torch(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first heads heads of x [num_tokens, >= heads, head_dim], rotated by cos, sin [num_tokens, hd]."""
    y = x[:, :heads]
    return y * cos[:, None, :] + _rotate_half(y) * sin[:, None, :]


def _triton() -> tuple[NormFn, RopeFn] | None:
    try:
        mod = importlib.import_module("replica.kernels.norm_rope")
    except Exception as exc:  # no triton or no driver: the torch ops serve
        log.info("Triton norm and RoPE kernels unavailable (%s); using torch ops", exc)
        return None
    return mod.rms_norm, mod.rope


IMPLEMENTATIONS: dict[str, tuple[NormFn, RopeFn]] = {"torch": (rms_norm_torch, rope_torch)}
_triton_impl = _triton() if torch.cuda.is_available() else None
if _triton_impl is not None:
    IMPLEMENTATIONS["triton"] = _triton_impl
DEVICE_IMPLEMENTATION: dict[str, str] = {"cuda": "triton" if "triton" in IMPLEMENTATIONS else "torch"}


def _impl(device: torch.device) -> tuple[NormFn, RopeFn]:
    return IMPLEMENTATIONS[DEVICE_IMPLEMENTATION.get(device.type, "torch")]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of x [num_tokens, hidden]."""
    return _impl(x.device)[0](x, weight, eps)


def rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first heads heads of x [num_tokens, >= heads, head_dim], rotated: [num_tokens, heads, head_dim]."""
    head_dim = x.shape[-1]
    if head_dim & (head_dim - 1):  # the kernel tiles half a head as a power of two
        return rope_torch(x, heads, cos, sin)
    return _impl(x.device)[1](x, heads, cos, sin)
