"""Triton kernels that cover every rank bucket of a decode batch in one launch per projection.

Semantics (equal to lora_shrink and lora_expand run once per bucket; replica.kernels.reference):

    for i in range(num_tokens):
        k = the table entry whose bucket == bucket_of_row[i]    # 0: the row has no adapter
        if no entry: t[i] = 0; continue
        s, r = slot_of_row[i], rank of entry k
        t[i, :r] = (A_k[s].float() @ x[i].float()).to(x.dtype); t[i, r:] = 0
        out[i] += (scale_k[s].float() * (B_k[s].float() @ t[i, :r].float())).to(out.dtype)

Each bucket's stacks are separate tensors of one dtype. A BucketTable holds the first bucket's A, B and
scale as bases and, per bucket, every other stack's offset from its base in elements, its slot stride and
its rank: a GPU's flat address space lets one program reach any bucket's slot from one base pointer.
Shapes: x [num_tokens, hidden_in], out [num_tokens, hidden_out] (rows may be strided, last dim contiguous);
a_k [num_slots_k, rank_k, hidden_in], b_k [num_slots_k, hidden_out, rank_k], each slot contiguous;
scale_k [num_slots_k] fp32 (any stride); bucket_of_row, slot_of_row [num_tokens] int32;
t [num_tokens, max_rank]. Slots are not range-checked (a host sync per call): callers own the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replica.kernels.launch_checks import check_float, check_rows, check_same_device, check_slots, check_stack
from replica.kernels.lora_expand import expand_row
from replica.kernels.lora_shrink import gathered_block_r, gemv_rows

_COLUMNS = 8  # bucket, a_off, a_stride, b_off, b_stride, s_off, s_stride, rank


@dataclass(frozen=True)
class BucketTable:
    """One adapted projection's stacks of every rank bucket, reachable from three base pointers."""

    a: torch.Tensor  # the first bucket's a_stack: base of every A offset
    b: torch.Tensor  # the first bucket's b_stack
    scale: torch.Tensor  # the first bucket's scale (fp32)
    entries: torch.Tensor  # [num_buckets, 8] int64 on the stacks' device
    num_buckets: int
    max_rank: int
    hidden_in: int
    hidden_out: int


def bucket_table(stacks: Sequence[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]) -> BucketTable:
    """stacks: (bucket, a_stack, b_stack, scale) per rank bucket; every stack of one dtype and device."""
    if not stacks:
        raise ValueError("a bucket table needs at least one bucket")
    _, a0, b0, s0 = stacks[0]
    rows = []
    for bucket, a, b, scale in stacks:
        check_stack("a_stack", a)
        check_stack("b_stack", b)
        if a.dtype != a0.dtype or b.dtype != a0.dtype or scale.dtype != torch.float32:
            raise ValueError("every bucket's A and B must share one dtype, and scales must be float32")
        if a.shape[2] != a0.shape[2] or b.shape[1] != b0.shape[1] or a.shape[1] != b.shape[2]:
            raise ValueError(f"bucket {bucket}: shapes {tuple(a.shape)} / {tuple(b.shape)} do not match")
        for t, base in ((a, a0), (b, b0), (scale, s0)):
            check_same_device("stack", t, a0)
            if (t.data_ptr() - base.data_ptr()) % t.element_size():
                raise ValueError("stacks must be element-aligned with the first bucket's")
        rows.append(
            [
                bucket,
                (a.data_ptr() - a0.data_ptr()) // a.element_size(),
                a.stride(0),
                (b.data_ptr() - b0.data_ptr()) // b.element_size(),
                b.stride(0),
                (scale.data_ptr() - s0.data_ptr()) // 4,
                scale.stride(0),
                a.shape[1],
            ]
        )
    entries = torch.tensor(rows, dtype=torch.int64, device=a0.device)  # [num_buckets, 8]
    return BucketTable(a0, b0, s0, entries, len(rows), max(r[7] for r in rows), a0.shape[2], b0.shape[1])


@triton.jit
def _entry(entries_ptr, row_bucket, NUM_BUCKETS: tl.constexpr, COL: tl.constexpr):
    # the COL column of the entry whose bucket is row_bucket (0 when none is)
    value = tl.zeros((), dtype=tl.int64)
    for k in tl.static_range(NUM_BUCKETS):
        hit = tl.load(entries_ptr + k * 8) == row_bucket
        value = tl.where(hit, tl.load(entries_ptr + k * 8 + COL), value)
    return value


@triton.jit
def _shrink_multi_kernel(
    x_ptr,  # [num_tokens, hidden_in]
    a_ptr,  # the first bucket's a_stack
    entries_ptr,  # [NUM_BUCKETS, 8] int64
    bucket_ptr,  # [num_tokens] int32
    slot_ptr,  # [num_tokens] int32
    t_ptr,  # [num_tokens, max_rank]
    hidden_in,
    max_rank,
    stride_x,
    NUM_BUCKETS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One program per (row, chunk of the largest rank): a GEMV against its own bucket's slot.
    row = tl.program_id(0)
    r_offs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    t_mask = r_offs < max_rank
    t_row = t_ptr + row.to(tl.int64) * max_rank
    row_bucket = tl.load(bucket_ptr + row).to(tl.int64)
    rank = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 7)
    if rank == 0:  # no adapter (or a bucket this projection lacks): t stays zero
        tl.store(t_row + r_offs, tl.zeros([BLOCK_R], dtype=t_ptr.dtype.element_ty), mask=t_mask)
        return
    a_off = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 1)
    a_stride = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    r_mask = r_offs < rank
    x_row = x_ptr + row.to(tl.int64) * stride_x
    a_rows = a_ptr + a_off + slot * a_stride + r_offs[:, None].to(tl.int64) * hidden_in  # [BLOCK_R, 1]
    t_val = gemv_rows(x_row, a_rows, r_mask, hidden_in, BLOCK_R, BLOCK_K)  # [BLOCK_R]: 0 past the rank
    tl.store(t_row + r_offs, t_val.to(t_ptr.dtype.element_ty), mask=t_mask)


@triton.jit
def _expand_multi_kernel(
    out_ptr,  # [num_tokens, hidden_out]
    t_ptr,  # [num_tokens, max_rank]
    b_ptr,  # the first bucket's b_stack
    scale_ptr,  # the first bucket's scale (fp32)
    entries_ptr,  # [NUM_BUCKETS, 8] int64
    bucket_ptr,  # [num_tokens] int32
    slot_ptr,  # [num_tokens] int32
    hidden_out,
    max_rank,
    stride_out,
    NUM_BUCKETS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,  # the largest rank padded to a power of two
):
    # One program per (row, tile of hidden_out): its bucket's B tile [BLOCK_D, rank] is one read.
    row = tl.program_id(0)
    row_bucket = tl.load(bucket_ptr + row).to(tl.int64)
    rank = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 7)
    if rank == 0:
        return
    b_off = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 3)
    b_stride = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 4)
    s_off = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 5)
    s_stride = _entry(entries_ptr, row_bucket, NUM_BUCKETS, 6)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    scale = tl.load(scale_ptr + s_off + slot * s_stride).to(tl.float32)
    t_row = t_ptr + row.to(tl.int64) * max_rank
    out_row = out_ptr + row.to(tl.int64) * stride_out
    expand_row(out_row, t_row, b_ptr + b_off + slot * b_stride, scale, hidden_out, rank, BLOCK_D, BLOCK_R)


def _check_rows_meta(
    table: BucketTable, like: torch.Tensor, bucket_of_row: torch.Tensor, slots: torch.Tensor
) -> int:
    check_rows("rows", like)
    check_float("rows", like)
    if like.dtype != table.a.dtype:
        raise ValueError(f"rows dtype {like.dtype} must equal the stacks' {table.a.dtype}")
    num_tokens = like.shape[0]
    check_slots(bucket_of_row, num_tokens)
    check_slots(slots, num_tokens)
    for name, t in (("stacks", table.a), ("bucket_of_row", bucket_of_row), ("slot_of_row", slots)):
        check_same_device(name, t, like)
    return num_tokens


def shrink_multi(
    x: torch.Tensor, table: BucketTable, bucket_of_row: torch.Tensor, slot_of_row: torch.Tensor
) -> torch.Tensor:
    """t [num_tokens, max_rank]: each row times its own bucket's A; one launch for every bucket."""
    num_tokens = _check_rows_meta(table, x, bucket_of_row, slot_of_row)
    if x.shape[1] != table.hidden_in:
        raise ValueError(f"x has hidden_in {x.shape[1]}, the stacks {table.hidden_in}")
    t = torch.empty(num_tokens, table.max_rank, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return t
    block_r = gathered_block_r(table.max_rank, num_tokens)
    block_k = max(64, min(512, 4096 // block_r, triton.next_power_of_2(table.hidden_in)))
    grid = (num_tokens, triton.cdiv(table.max_rank, block_r))
    _shrink_multi_kernel[grid](
        x, table.a, table.entries, bucket_of_row, slot_of_row, t, table.hidden_in, table.max_rank,
        x.stride(0), NUM_BUCKETS=table.num_buckets, BLOCK_R=block_r, BLOCK_K=block_k,
    )  # fmt: skip
    return t


def expand_multi(
    out: torch.Tensor,
    t: torch.Tensor,
    table: BucketTable,
    bucket_of_row: torch.Tensor,
    slot_of_row: torch.Tensor,
) -> None:
    """out[i] += scale * B @ t[i] with each row's own bucket; one launch for every bucket."""
    num_tokens = _check_rows_meta(table, out, bucket_of_row, slot_of_row)
    if out.shape[1] != table.hidden_out or tuple(t.shape) != (num_tokens, table.max_rank):
        raise ValueError(f"out {tuple(out.shape)} / t {tuple(t.shape)} do not fit the stacks")
    if num_tokens == 0:
        return
    block_r = triton.next_power_of_2(table.max_rank)
    block_d = max(16, min(256, 4096 // block_r))
    grid = (num_tokens, triton.cdiv(table.hidden_out, block_d))
    _expand_multi_kernel[grid](
        out, t, table.b, table.scale, table.entries, bucket_of_row, slot_of_row, table.hidden_out,
        table.max_rank, out.stride(0), NUM_BUCKETS=table.num_buckets, BLOCK_D=block_d, BLOCK_R=block_r,
    )  # fmt: skip
