"""The paged-KV operations the attention layer calls: cache writes, a prefill's context, decode attention.

Caches are [num_blocks, block_size, kv_heads, head_dim] per layer; a token's K/V live at flat position
block * block_size + offset (its slot in slot_mapping). Decode attention runs the Triton kernel
(kernels.paged_attention) on CUDA and a batched torch path elsewhere; both equal
reference.paged_decode_ref.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

DecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store each token's K and V at its slot."""
    # caches [num_blocks, block_size, kv_heads, head_dim]; slot_mapping [num_tokens];
    # k, v [num_tokens, kv_heads, head_dim]
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v


def gather_context(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first length positions of one sequence, copied out of its blocks: [length, kv_heads, head_dim]."""
    # cache [num_blocks, block_size, kv_heads, head_dim]; block_ids [>= ceil(length / block_size)]
    return cache[block_ids].reshape(-1, *cache.shape[2:])[:length]


def paged_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_blocks: int,
    scale: float,
) -> torch.Tensor:
    """Decode attention by gathering each row's first max_blocks blocks and masking past its length."""
    # q [num_rows, heads, head_dim]; block_tables [num_rows, >= max_blocks]; context_lens [num_rows]
    tables = block_tables[:, :max_blocks].reshape(-1).long()  # [num_rows * max_blocks]
    rows, width = block_tables.shape[0], max_blocks * k_cache.shape[1]
    # index_select: half the cost of advanced indexing for a gather of whole blocks; k [rows, kvh, width, hd]
    k = k_cache.index_select(0, tables).view(rows, width, *k_cache.shape[2:]).transpose(1, 2)
    v = v_cache.index_select(0, tables).view(rows, width, *v_cache.shape[2:]).transpose(1, 2)
    # a row of length 0 (never scheduled, only padding) attends to position 0, so its output stays finite
    keep = torch.arange(width, device=q.device)[None, :] < context_lens.clamp(min=1)[:, None]  # [rows, width]
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], k, v, attn_mask=keep[:, None, None, :], scale=scale, enable_gqa=True
    )  # [rows, heads, 1, head_dim]
    return out.squeeze(2)


def _triton_decode() -> DecodeFn | None:
    try:
        module = importlib.import_module("replica.kernels.paged_attention")
    except Exception as exc:  # no triton or no driver: the torch path serves
        log.info("Triton paged attention unavailable (%s); using the torch path", exc)
        return None
    fn: DecodeFn = module.paged_decode
    return fn


_TRITON_DECODE = _triton_decode() if torch.cuda.is_available() else None


def has_triton_decode() -> bool:
    """True when CUDA decode attention runs the Triton kernel (no host sync, no data-sized shapes)."""
    return _TRITON_DECODE is not None


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_blocks: int,
    scale: float,
) -> torch.Tensor:
    """out [num_rows, heads, head_dim]; max_blocks (the longest row's blocks) bounds the torch path."""
    if q.device.type == "cuda" and _TRITON_DECODE is not None:
        return _TRITON_DECODE(q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, max_blocks, scale)
