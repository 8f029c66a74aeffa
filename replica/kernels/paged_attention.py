"""Triton paged decode attention: each decoding row reads only its own blocks, up to its own length.

Semantics (reference.paged_decode_ref is this loop):

    for i in range(num_rows):
        n = context_lens[i]
        blocks = block_tables[i, : ceil(n / block_size)]
        k = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:n]     # [n, kv_heads, head_dim]
        v = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:n]
        for h in range(heads):
            g = h // (heads // kv_heads)                              # grouped-query attention
            p = softmax(scale * k[:, g].float() @ q[i, h].float())    # [n], fp32
            out[i, h] = (p @ v[:, g].float()).to(q.dtype)

Shapes: q [num_rows, heads, head_dim] (last dim contiguous); k_cache, v_cache [num_blocks, block_size,
kv_heads, head_dim] contiguous; block_tables [num_rows, max_blocks] int32 (entries past a row's length are
never read); context_lens [num_rows] int32. A row of length 0 gets zeros. The grid is (num_rows, kv_heads)
whatever the lengths, and lengths and tables are read from device memory, so a launch has static shapes and
no host sync: it can be captured in a CUDA graph. Block ids are not range-checked (that would need a sync):
the block manager owns the tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kernels.launch_checks import check_float, check_same_device

TABLE_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [num_rows, heads, head_dim]
    k_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    v_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    table_ptr,  # [num_rows, max_blocks]
    len_ptr,  # [num_rows]
    out_ptr,  # [num_rows, heads, head_dim]
    scale,
    head_dim,
    stride_q_row,
    stride_q_head,
    stride_k_block,
    stride_k_token,
    stride_k_head,
    stride_table,
    stride_o_row,
    stride_o_head,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # head_dim rounded up to a power of two
):
    # One program per (row, KV head): its GROUP query heads share every K/V load (online softmax, fp32).
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    n = tl.load(len_ptr + row)
    g = tl.arange(0, GROUP_PAD)
    g_mask = g < GROUP
    d = tl.arange(0, HEAD_PAD)
    d_mask = d < head_dim
    heads = kv_head * GROUP + g  # [GROUP_PAD]
    q_offs = row * stride_q_row + heads[:, None].to(tl.int64) * stride_q_head + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    t = tl.arange(0, BLOCK_SIZE)
    for b in range(0, tl.cdiv(n, BLOCK_SIZE)):
        block = tl.load(table_ptr + row * stride_table + b).to(tl.int64)
        t_mask = b * BLOCK_SIZE + t < n  # [BLOCK_SIZE]
        kv_offs = (
            block * stride_k_block
            + t[:, None].to(tl.int64) * stride_k_token
            + kv_head * stride_k_head
            + d[None, :]
        )
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, HEAD_PAD]
        v = tl.load(v_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, HEAD_PAD]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # [GROUP_PAD]
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])  # [GROUP_PAD, BLOCK_SIZE]
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    o_offs = row * stride_o_row + heads[:, None].to(tl.int64) * stride_o_head + d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """out [num_rows, heads, head_dim]: each row's attention over its own cached positions (see module)."""
    check_float("q", q)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_same_device(name, t, q)
    check_same_device("context_lens", context_lens, q)
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [num_rows, heads, head_dim], last dim contiguous; got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"the caches must have q's dtype {q.dtype}, got {k_cache.dtype}")
    num_rows, heads, head_dim = q.shape
    _, block_size, kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim or heads % kv_heads:
        raise ValueError(
            f"q has {heads} heads of {head_dim}; the cache {kv_heads} KV heads of {cache_head_dim}"
        )
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    for name, t in (("block_tables", block_tables), ("context_lens", context_lens)):
        if t.dtype not in TABLE_DTYPES or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 or int64 tensor, got {t.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_rows or context_lens.shape != (num_rows,):
        raise ValueError(f"block_tables must be [{num_rows}, max_blocks] and context_lens [{num_rows}]")
    out = torch.empty_like(q)
    if num_rows == 0:
        return out
    group = heads // kv_heads
    _paged_decode_kernel[(num_rows, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        scale,
        head_dim,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_PAD=triton.next_power_of_2(head_dim),
    )
    return out
