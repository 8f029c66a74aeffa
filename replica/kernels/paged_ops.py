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
from typing import NamedTuple

import torch

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
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def gather_context(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first length positions of one sequence, copied out of its blocks: [length, kv_heads, head_dim]."""
    # cache [num_blocks, block_size, kv_heads, head_dim]; block_ids [>= ceil(length / block_size)]
    return cache[block_ids].reshape(-1, *cache.shape[2:])[:length]


class DecodeIndex(NamedTuple):
    """What the torch decode path reads the same way in every layer of a step: built once, by the first."""

    blocks: torch.Tensor  # [num_rows * max_blocks] long: each row's first max_blocks blocks
    bias: torch.Tensor  # [num_rows, 1, 1, max_blocks * block_size] fp32: 0 within the row's length, else -inf


def decode_index(
    block_tables: torch.Tensor, context_lens: torch.Tensor, max_blocks: int, block_size: int
) -> DecodeIndex:
    """The torch path's gather index and length mask for a step's decoding rows."""
    # block_tables [num_rows, >= max_blocks]; context_lens [num_rows]
    blocks = block_tables[:, :max_blocks].reshape(-1).long()
    width = max_blocks * block_size
    # a row of length 0 (never scheduled, only padding) attends to position 0, so its output stays finite
    past = torch.arange(width, device=block_tables.device)[None, :] >= context_lens.clamp(min=1)[:, None]
    bias = torch.zeros(past.shape, dtype=torch.float32, device=past.device).masked_fill_(past, float("-inf"))
    return DecodeIndex(blocks, bias.view(-1, 1, 1, width))


def paged_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_blocks: int,
    scale: float,
    index: DecodeIndex | None = None,
) -> torch.Tensor:
    """Decode attention by gathering each row's first max_blocks blocks and masking past its length.

    Grouped heads share their K/V head by a reshape (head h reads K/V head h // group), and the softmax is
    taken in fp32: a handful of operators a layer, the index and mask built once a step (index)."""
    # q [num_rows, heads, head_dim]; block_tables [num_rows, >= max_blocks]; context_lens [num_rows]
    if index is None:
        index = decode_index(block_tables, context_lens, max_blocks, k_cache.shape[1])
    rows, heads, hd = q.shape
    kv_heads, width = k_cache.shape[2], index.bias.shape[-1]
    # index_select: half the cost of advanced indexing for a gather of whole blocks; k [rows, width, kvh, hd]
    k = k_cache.index_select(0, index.blocks).view(rows, width, kv_heads, hd)
    v = v_cache.index_select(0, index.blocks).view(rows, width, kv_heads, hd)
    qg = (q.float() * scale).view(rows, kv_heads, heads // kv_heads, hd)  # [rows, kvh, group, hd]
    scores = torch.matmul(qg, k.float().permute(0, 2, 3, 1))  # [rows, kvh, group, width]
    probs = torch.softmax(scores.add_(index.bias), dim=-1)
    out = torch.matmul(probs, v.float().transpose(1, 2))  # [rows, kvh, group, hd]
    return out.view(rows, heads, hd).to(q.dtype)


def _triton_decode() -> DecodeFn | None:
    try:
        module = importlib.import_module("replica.kernels.paged_attention")
    except Exception as exc:  # no triton or no driver: the torch path serves
        log.info("Triton paged attention unavailable (%s); using the torch path", exc)
        return None
    fn: DecodeFn = module.paged_decode
    return fn


_TRITON_DECODE = _triton_decode() if torch.cuda.is_available() else None


def uses_kernel(device: torch.device) -> bool:
    """True where decode attention on this device runs the Triton kernel (which needs no decode_index)."""
    return device.type == "cuda" and _TRITON_DECODE is not None


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
    index: DecodeIndex | None = None,
) -> torch.Tensor:
    """out [num_rows, heads, head_dim]; max_blocks (the longest row's blocks) bounds the torch path, and
    index (decode_index, where the caller keeps one for the step) saves it rebuilding its gather and mask."""
    if uses_kernel(q.device):
        return _TRITON_DECODE(q, k_cache, v_cache, block_tables, context_lens, scale)  # type: ignore[misc]
    return paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, max_blocks, scale, index)
