"""Triton shrink kernels: t[i] = a_stack[slot_of_row[i]] @ x[i], gathered per row or segmented by slot.

Semantics (both launchers equal this torch loop; reference.lora_shrink_ref is the batched form):

    t = torch.zeros(num_tokens, rank, dtype=x.dtype)
    for i in range(num_tokens):
        s = slot_of_row[i]
        if s >= 0:
            t[i] = (a_stack[s].float() @ x[i].float()).to(x.dtype)   # fp32 accumulation

Shapes: x [num_tokens, hidden_in] (rows may be strided, last dim contiguous);
a_stack [num_slots, rank, hidden_in], each slot contiguous (any slot stride);
slot_of_row [num_tokens] int32/int64 in [-1, num_slots).
Slots out of range are not checked (that would cost a host sync per call): callers own the slot table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kernels.launch_checks import check_float, check_rows, check_same_device, check_slots, check_stack
from replica.kernels.segments import Segments


@triton.jit
def gemv_rows(x_row, a_rows, r_mask, hidden_in, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    # [BLOCK_R] fp32: rows a_rows [BLOCK_R, 1] (pointers to each rank row's start) times x_row, zero where
    # r_mask is off; a GEMV without tl.dot, so any rank works without padding.
    acc = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, hidden_in, BLOCK_K):
        k_offs = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        k_mask = k_offs < hidden_in
        xv = tl.load(x_row + k_offs, mask=k_mask, other=0.0).to(tl.float32)  # [BLOCK_K]
        av = tl.load(a_rows + k_offs[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0)
        acc += av.to(tl.float32) * xv[None, :]  # [BLOCK_R, BLOCK_K]
    return tl.sum(acc, axis=1)


@triton.jit
def _shrink_gathered_kernel(
    x_ptr,  # [num_tokens, hidden_in]
    a_ptr,  # [num_slots, rank, hidden_in]
    slot_ptr,  # [num_tokens]
    t_ptr,  # [num_tokens, rank]
    hidden_in,
    rank,
    stride_x,
    stride_a,  # a_stack.stride(0)
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One program per (row, chunk of rank): a GEMV without tl.dot, so any rank works without padding.
    row = tl.program_id(0)
    r_offs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    r_mask = r_offs < rank
    slot = tl.load(slot_ptr + row).to(tl.int64)
    t_row = t_ptr + row.to(tl.int64) * rank
    if slot < 0:
        tl.store(t_row + r_offs, tl.zeros([BLOCK_R], dtype=t_ptr.dtype.element_ty), mask=r_mask)
        return
    x_row = x_ptr + row.to(tl.int64) * stride_x
    a_rows = a_ptr + slot * stride_a + r_offs[:, None].to(tl.int64) * hidden_in  # [BLOCK_R, 1]
    t_val = gemv_rows(x_row, a_rows, r_mask, hidden_in, BLOCK_R, BLOCK_K)  # [BLOCK_R]
    tl.store(t_row + r_offs, t_val.to(t_ptr.dtype.element_ty), mask=r_mask)


@triton.jit
def _shrink_segmented_kernel(
    x_ptr,  # [num_tokens, hidden_in]
    a_ptr,  # [num_slots, rank, hidden_in]
    perm_ptr,  # [num_tokens] row index per sorted position
    seg_slot_ptr,  # [num_segments]
    seg_start_ptr,  # [num_segments]
    seg_len_ptr,  # [num_segments]
    t_ptr,  # [num_tokens, rank], zero-filled by the launcher
    hidden_in,
    rank,
    stride_x,
    stride_a,  # a_stack.stride(0)
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rank padded to a power of two >= 16 for tl.dot
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,  # "tf32" (exact for fp16/bf16 inputs) or "ieee" for fp32 inputs
):
    # One program per (segment, tile of BLOCK_M rows): the tile reads its adapter's A once.
    seg = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    seg_len = tl.load(seg_len_ptr + seg)
    if m0 >= seg_len:
        return
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    start = tl.load(seg_start_ptr + seg)
    m_offs = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    m_mask = m_offs < seg_len
    rows = tl.load(perm_ptr + start + m_offs, mask=m_mask, other=0).to(tl.int64)  # [BLOCK_M]
    r_offs = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    r_mask = r_offs < rank
    a_base = a_ptr + slot * stride_a
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, hidden_in, BLOCK_K):
        k_offs = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        k_mask = k_offs < hidden_in
        xv = tl.load(  # [BLOCK_M, BLOCK_K]
            x_ptr + rows[:, None] * stride_x + k_offs[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        av = tl.load(  # [BLOCK_K, BLOCK_R]: A^T tile, zero past the real rank
            a_base + r_offs[None, :].to(tl.int64) * hidden_in + k_offs[:, None],
            mask=k_mask[:, None] & r_mask[None, :],
            other=0.0,
        )
        # fp32 operands: the interpreter has no bf16 arithmetic, and tf32 holds fp16/bf16 values exactly.
        acc = tl.dot(xv.to(tl.float32), av.to(tl.float32), acc, input_precision=PRECISION)
    t_ptrs = t_ptr + rows[:, None] * rank + r_offs[None, :]
    tl.store(t_ptrs, acc.to(t_ptr.dtype.element_ty), mask=m_mask[:, None] & r_mask[None, :])


def gathered_block_r(rank: int, num_tokens: int) -> int:
    """Split the rank across programs until a small decode batch fills the GPU."""
    block_r = triton.next_power_of_2(rank)
    while block_r > 4 and num_tokens * triton.cdiv(rank, block_r) < 256:
        block_r //= 2
    return block_r


def shrink_gathered(x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor) -> torch.Tensor:
    """Decode launch: one program per (row, rank chunk) gathering its row's A; t [num_tokens, rank].

    Semantics: the loop in this module's docstring.
    """
    num_tokens, hidden_in = _check_shrink(x, a_stack, slot_of_row)
    rank = a_stack.shape[1]
    t = torch.empty(num_tokens, rank, dtype=x.dtype, device=x.device)  # [num_tokens, rank]
    if num_tokens == 0:
        return t
    block_r = gathered_block_r(rank, num_tokens)
    block_k = max(64, min(512, 4096 // block_r, triton.next_power_of_2(hidden_in)))
    grid = (num_tokens, triton.cdiv(rank, block_r))
    _shrink_gathered_kernel[grid](
        x,
        a_stack,
        slot_of_row,
        t,
        hidden_in,
        rank,
        x.stride(0),
        a_stack.stride(0),
        BLOCK_R=block_r,
        BLOCK_K=block_k,
    )
    return t


def shrink_segmented(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, segments: Segments
) -> torch.Tensor:
    """Prefill launch: one program per (segment, tile of rows), each reading its adapter's A once per tile.

    Semantics: the loop in this module's docstring; `segments` must come from build_segments(slot_of_row).
    """
    num_tokens, hidden_in = _check_shrink(x, a_stack, slot_of_row)
    if segments.num_tokens != num_tokens:
        raise ValueError(f"segments were built for {segments.num_tokens} rows, x has {num_tokens}")
    check_same_device("segments.perm", segments.perm, x)
    rank = a_stack.shape[1]
    t = torch.zeros(num_tokens, rank, dtype=x.dtype, device=x.device)  # [num_tokens, rank]; -1 rows stay 0
    if segments.num_segments == 0:
        return t
    block_m = 16 if segments.max_len <= 16 else (32 if segments.max_len <= 256 else 64)
    block_r = max(16, triton.next_power_of_2(rank))
    block_k = 64 if block_r <= 32 else 32
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (segments.num_segments, triton.cdiv(segments.max_len, block_m))
    _shrink_segmented_kernel[grid](
        x,
        a_stack,
        segments.perm,
        segments.seg_slot,
        segments.seg_start,
        segments.seg_len,
        t,
        hidden_in,
        rank,
        x.stride(0),
        a_stack.stride(0),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        PRECISION=precision,
    )
    return t


def _check_shrink(x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor) -> tuple[int, int]:
    """Validate shrink inputs and return (num_tokens, hidden_in)."""
    check_rows("x", x)
    check_stack("a_stack", a_stack)
    check_float("x", x)
    if a_stack.dtype != x.dtype:
        raise ValueError(f"a_stack dtype {a_stack.dtype} must equal x dtype {x.dtype}")
    num_tokens, hidden_in = x.shape
    if a_stack.shape[2] != hidden_in:
        raise ValueError(
            f"a_stack [num_slots, rank, hidden_in] has hidden_in {a_stack.shape[2]}, x has {hidden_in}"
        )
    check_slots(slot_of_row, num_tokens)
    check_same_device("a_stack", a_stack, x)
    check_same_device("slot_of_row", slot_of_row, x)
    return num_tokens, hidden_in
