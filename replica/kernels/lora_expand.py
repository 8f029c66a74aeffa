"""Triton expand kernels: out[i] += scale[s] * b_stack[s] @ t[i], s = slot_of_row[i]; gathered or segmented.

Semantics (both launchers equal this torch loop; reference.lora_expand_ref is the batched form):

    for i in range(num_tokens):
        s = slot_of_row[i]
        if s >= 0:
            delta = scale[s].float() * (b_stack[s].float() @ t[i].float())   # fp32 accumulation
            out[i] += delta.to(out.dtype)                                      # rows with s == -1 untouched

Shapes: out [num_tokens, hidden_out] (rows may be strided, last dim contiguous), updated in place;
t [num_tokens, rank] contiguous; b_stack [num_slots, hidden_out, rank], each slot contiguous (any slot
stride); scale [num_slots] float (any stride);
slot_of_row [num_tokens] int32/int64 in [-1, num_slots). out, t and b_stack share one dtype.
Slots out of range are not checked (that would cost a host sync per call): callers own the slot table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kernels.launch_checks import check_float, check_rows, check_same_device, check_slots, check_stack
from replica.kernels.segments import Segments


@triton.jit
def expand_row(out_row, t_row, b_slot, scale, hidden_out, rank, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    # out_row[d] += scale * B[d, :rank] @ t_row[:rank] for this program's tile of hidden_out; b_slot points at
    # the slot's B [hidden_out, rank]. delta is rounded to out's dtype before adding, as the reference's
    # out.add_(delta.to(out.dtype)) does.
    d_offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_mask = d_offs < hidden_out
    r_offs = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    r_mask = r_offs < rank
    tv = tl.load(t_row + r_offs, mask=r_mask, other=0.0).to(tl.float32)
    bv = tl.load(  # [BLOCK_D, BLOCK_R]
        b_slot + d_offs[:, None].to(tl.int64) * rank + r_offs[None, :],
        mask=d_mask[:, None] & r_mask[None, :],
        other=0.0,
    )
    delta = tl.sum(bv.to(tl.float32) * tv[None, :], axis=1) * scale  # [BLOCK_D]
    old = tl.load(out_row + d_offs, mask=d_mask, other=0.0).to(tl.float32)
    new = old + delta.to(out_row.dtype.element_ty).to(tl.float32)
    tl.store(out_row + d_offs, new.to(out_row.dtype.element_ty), mask=d_mask)


@triton.jit
def _expand_gathered_kernel(
    out_ptr,  # [num_tokens, hidden_out]
    t_ptr,  # [num_tokens, rank]
    b_ptr,  # [num_slots, hidden_out, rank]
    scale_ptr,  # [num_slots]
    slot_ptr,  # [num_tokens]
    hidden_out,
    rank,
    stride_out,
    stride_b,  # b_stack.stride(0)
    stride_scale,  # scale.stride(0)
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rank padded to a power of two; no tl.dot, so no minimum
):
    # One program per (row, tile of hidden_out): the B tile [BLOCK_D, rank] is one contiguous read.
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    scale = tl.load(scale_ptr + slot * stride_scale).to(tl.float32)
    t_row = t_ptr + row.to(tl.int64) * rank
    out_row = out_ptr + row.to(tl.int64) * stride_out
    expand_row(out_row, t_row, b_ptr + slot * stride_b, scale, hidden_out, rank, BLOCK_D, BLOCK_R)


@triton.jit
def _expand_segmented_kernel(
    out_ptr,  # [num_tokens, hidden_out]
    t_ptr,  # [num_tokens, rank]
    b_ptr,  # [num_slots, hidden_out, rank]
    scale_ptr,  # [num_slots]
    perm_ptr,  # [num_tokens]
    seg_slot_ptr,  # [num_segments]
    seg_start_ptr,  # [num_segments]
    seg_len_ptr,  # [num_segments]
    hidden_out,
    rank,
    stride_out,
    stride_b,  # b_stack.stride(0)
    stride_scale,  # scale.stride(0)
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rank padded to a power of two >= 16 for tl.dot
    PRECISION: tl.constexpr,  # "tf32" (exact for fp16/bf16 inputs) or "ieee" for fp32 inputs
):
    # One program per (segment, tile of rows, tile of hidden_out): the B tile is read once per row tile.
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
    d_offs = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_mask = d_offs < hidden_out
    r_offs = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    r_mask = r_offs < rank
    tv = tl.load(  # [BLOCK_M, BLOCK_R], zero past the real rank
        t_ptr + rows[:, None] * rank + r_offs[None, :], mask=m_mask[:, None] & r_mask[None, :], other=0.0
    )
    bv = tl.load(  # [BLOCK_R, BLOCK_D]: B^T tile
        b_ptr + slot * stride_b + d_offs[None, :].to(tl.int64) * rank + r_offs[:, None],
        mask=r_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    scale = tl.load(scale_ptr + slot * stride_scale).to(tl.float32)
    # fp32 operands: the interpreter has no bf16 arithmetic, and tf32 holds fp16/bf16 values exactly.
    delta = (
        tl.dot(tv.to(tl.float32), bv.to(tl.float32), input_precision=PRECISION) * scale
    )  # [BLOCK_M, BLOCK_D] fp32
    out_ptrs = out_ptr + rows[:, None] * stride_out + d_offs[None, :]
    io_mask = m_mask[:, None] & d_mask[None, :]
    old = tl.load(out_ptrs, mask=io_mask, other=0.0).to(tl.float32)
    new = old + delta.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptrs, new.to(out_ptr.dtype.element_ty), mask=io_mask)


def expand_gathered(
    out: torch.Tensor, t: torch.Tensor, b_stack: torch.Tensor, scale: torch.Tensor, slot_of_row: torch.Tensor
) -> None:
    """Decode launch: one program per (row, hidden_out tile), gathering each row's B; out updated in place.

    Semantics: the loop in this module's docstring.
    """
    num_tokens, hidden_out = _check_expand(out, t, b_stack, scale, slot_of_row)
    if num_tokens == 0:
        return
    rank = b_stack.shape[2]
    block_r = triton.next_power_of_2(rank)
    block_d = max(16, min(256, 4096 // block_r, triton.next_power_of_2(hidden_out)))
    grid = (num_tokens, triton.cdiv(hidden_out, block_d))
    _expand_gathered_kernel[grid](
        out,
        t,
        b_stack,
        scale,
        slot_of_row,
        hidden_out,
        rank,
        out.stride(0),
        b_stack.stride(0),
        scale.stride(0),
        BLOCK_D=block_d,
        BLOCK_R=block_r,
    )


def expand_segmented(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    segments: Segments,
) -> None:
    """Prefill launch: one program per (segment, row tile, hidden_out tile), B read once per row tile.

    Semantics: the loop in this module's docstring; `segments` must come from build_segments(slot_of_row).
    """
    num_tokens, hidden_out = _check_expand(out, t, b_stack, scale, slot_of_row)
    if segments.num_tokens != num_tokens:
        raise ValueError(f"segments were built for {segments.num_tokens} rows, out has {num_tokens}")
    check_same_device("segments.perm", segments.perm, out)
    if segments.num_segments == 0:
        return
    rank = b_stack.shape[2]
    block_m = 16 if segments.max_len <= 16 else (32 if segments.max_len <= 256 else 64)
    block_r = max(16, triton.next_power_of_2(rank))
    block_d = 64 if block_r <= 32 else 32
    precision = "ieee" if out.dtype == torch.float32 else "tf32"
    grid = (segments.num_segments, triton.cdiv(segments.max_len, block_m), triton.cdiv(hidden_out, block_d))
    _expand_segmented_kernel[grid](
        out,
        t,
        b_stack,
        scale,
        segments.perm,
        segments.seg_slot,
        segments.seg_start,
        segments.seg_len,
        hidden_out,
        rank,
        out.stride(0),
        b_stack.stride(0),
        scale.stride(0),
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        BLOCK_R=block_r,
        PRECISION=precision,
    )


def _check_expand(
    out: torch.Tensor, t: torch.Tensor, b_stack: torch.Tensor, scale: torch.Tensor, slot_of_row: torch.Tensor
) -> tuple[int, int]:
    """Validate expand inputs and return (num_tokens, hidden_out)."""
    check_rows("out", out)
    check_rows("t", t)
    check_stack("b_stack", b_stack)
    check_float("out", out)
    if t.dtype != out.dtype or b_stack.dtype != out.dtype:
        raise ValueError(f"t ({t.dtype}) and b_stack ({b_stack.dtype}) must match out's dtype {out.dtype}")
    if not t.is_contiguous():
        raise ValueError("t must be contiguous")
    num_tokens, hidden_out = out.shape
    num_slots, b_hidden, rank = b_stack.shape
    if b_hidden != hidden_out:
        raise ValueError(
            f"b_stack [num_slots, hidden_out, rank] has hidden_out {b_hidden}, out has {hidden_out}"
        )
    if tuple(t.shape) != (num_tokens, rank):
        raise ValueError(f"t must have shape [{num_tokens}, {rank}] (num_tokens, rank), got {tuple(t.shape)}")
    if scale.dim() != 1 or scale.shape[0] != num_slots:
        raise ValueError(f"scale must have shape [{num_slots}] (num_slots), got {tuple(scale.shape)}")
    check_float("scale", scale)
    check_slots(slot_of_row, num_tokens)
    for name, tensor in (("t", t), ("b_stack", b_stack), ("scale", scale), ("slot_of_row", slot_of_row)):
        check_same_device(name, tensor, out)
    return num_tokens, hidden_out
