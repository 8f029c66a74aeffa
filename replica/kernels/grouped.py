"""The torch (CPU) adapter path: rows grouped by slot, each group times its adapter once (SGMV in torch).

Per forward pass, build_grouped(slot_of_row) sorts the rows by slot and cuts each slot's run of rows into
chunks of at most `width` rows, width = ceil(rows with an adapter / distinct adapters). The chunks form a
padded [num_chunks, width] table of packed-row indices, so one torch.bmm per adapted linear multiplies
every chunk by its own adapter:

    shrink: t[chunk, j] = x[gather[chunk, j]] @ A[chunk_slot[chunk]]^T
    expand: out[row]  += scale[slot] * t[row] @ B[chunk_slot[chunk]]^T

Each distinct adapter's A and B are read once per chunk; with the width above there are at most twice as many
chunks as distinct adapters, and padding at most doubles the (small) adapter FLOPs, however skewed the batch
(one long prefill beside many decodes, or 32 rows on 32 adapters). There is no Python loop over adapters:
the table is built with a handful of vector ops on the slot vector, once per forward pass, and shared by all
adapted layers. When one adapter serves every row, the pool slot is a view (no gather of its weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupedRows:
    """Rows of one batch, for one rank bucket, grouped into per-slot chunks (all index tensors long)."""

    gather: torch.Tensor  # [num_chunks, width]: packed row of each position (pads point at a real row)
    chunk_slot: torch.Tensor  # [num_chunks]: the pool slot every row of the chunk uses
    out_pos: torch.Tensor | None  # [num_valid]: flat positions of real rows in gather (None: no pads)
    out_rows: torch.Tensor  # [num_valid]: the packed row at each of those positions
    num_tokens: int
    num_chunks: int
    width: int
    in_order: bool  # one chunk holding every row in packing order: x itself is the chunk
    single_slot: int | None  # the slot when there is exactly one chunk: weights taken as a view


def build_grouped(slot_of_row: torch.Tensor) -> GroupedRows | None:
    """Group rows by slot (stable); None when no row has an adapter in this pool."""
    # slot_of_row [num_tokens] int32/int64, values in [-1, num_slots)
    n = int(slot_of_row.shape[0])
    sorted_slots, perm = torch.sort(slot_of_row.long(), stable=True)  # [n], [n]
    slots, counts = torch.unique_consecutive(sorted_slots, return_counts=True)  # [distinct] each
    slot_list = slots.tolist()
    base_rows = int(counts[0]) if slot_list and slot_list[0] < 0 else 0
    if base_rows:
        slots, counts, perm = slots[1:], counts[1:], perm[base_rows:]
    distinct, valid = int(slots.shape[0]), n - base_rows
    if distinct == 0:
        return None
    width = min(-(-valid // distinct), int(counts.max()))
    chunks_per = (counts + width - 1) // width  # [distinct]
    num_chunks = int(chunks_per.sum())
    dev = slot_of_row.device
    seg_of_row = torch.repeat_interleave(torch.arange(distinct, device=dev), counts)  # [valid]
    pos = torch.arange(valid, device=dev) - (torch.cumsum(counts, 0) - counts)[seg_of_row]  # [valid]
    chunk_of_row = (torch.cumsum(chunks_per, 0) - chunks_per)[seg_of_row] + pos // width  # [valid]
    flat = chunk_of_row * width + pos % width  # [valid] position in the padded table
    gather = torch.full((num_chunks * width,), int(perm[0]), dtype=torch.long, device=dev)
    gather[flat] = perm
    padded = num_chunks * width != valid
    return GroupedRows(
        gather=gather.view(num_chunks, width),
        chunk_slot=torch.repeat_interleave(slots, chunks_per),
        out_pos=flat if padded else None,
        out_rows=perm,
        num_tokens=n,
        num_chunks=num_chunks,
        width=width,
        in_order=num_chunks == 1 and valid == n and bool((perm == torch.arange(n, device=dev)).all()),
        single_slot=int(slots[0]) if num_chunks == 1 else None,
    )


def _per_chunk(stack: torch.Tensor, g: GroupedRows) -> torch.Tensor:
    """stack [num_slots, p, q] -> [num_chunks, p, q]: a view for one chunk, else a gather of used slots."""
    if g.single_slot is not None:
        return stack.narrow(0, g.single_slot, 1)
    return stack.index_select(0, g.chunk_slot)  # half the cost of stack[g.chunk_slot] on strided views


def compute_dtype(t: torch.Tensor) -> torch.Tensor:
    """fp32 stays as is (no copy); half types are widened, as the reference accumulates in fp32."""
    return t if t.dtype == torch.float32 else t.float()


def grouped_shrink(x: torch.Tensor, a_stack: torch.Tensor, g: GroupedRows | None) -> torch.Tensor:
    """t [num_tokens, rank] = A[slot] @ x per row; zeros for rows without an adapter in this pool."""
    # x [num_tokens, hidden_in]; a_stack [num_slots, rank, hidden_in]
    rank = a_stack.shape[1]
    if g is None:
        return x.new_zeros(x.shape[0], rank)
    xc = compute_dtype(x)
    if g.in_order:  # one adapter over the whole batch: a plain matmul against the slot's A
        assert g.single_slot is not None
        return (xc @ compute_dtype(a_stack[g.single_slot]).T).to(x.dtype)  # [num_tokens, rank]
    xp = xc[g.gather]  # [num_chunks, width, hidden_in]
    tp = torch.bmm(xp, compute_dtype(_per_chunk(a_stack, g)).transpose(1, 2))  # [num_chunks, width, rank]
    flat = tp.view(-1, rank)
    t = x.new_zeros(x.shape[0], rank)
    t[g.out_rows] = (flat if g.out_pos is None else flat[g.out_pos]).to(x.dtype)
    return t


def grouped_expand(
    out: torch.Tensor, t: torch.Tensor, b_stack: torch.Tensor, scale: torch.Tensor, g: GroupedRows | None
) -> None:
    """out[i] += scale[slot] * B[slot] @ t[i] in place; rows without an adapter in this pool untouched."""
    # out [num_tokens, hidden_out]; t [num_tokens, rank]; b_stack [num_slots, hidden_out, rank]
    if g is None:
        return
    tc = compute_dtype(t)
    if g.in_order and out.dtype == torch.float32 and out.device.type == "cpu":
        assert g.single_slot is not None  # one fused multiply-add into out (scale read on the host: no sync)
        out.addmm_(tc, b_stack[g.single_slot].T, alpha=float(scale[g.single_slot]))
        return
    tp = tc.unsqueeze(0) if g.in_order else tc[g.gather]  # [num_chunks, width, rank]
    tp = tp * scale[g.chunk_slot].float().view(-1, 1, 1)
    delta = torch.bmm(tp, compute_dtype(_per_chunk(b_stack, g)).transpose(1, 2))  # [chunks, width, out]
    flat = delta.view(-1, out.shape[1])
    if g.in_order:
        out.add_(flat.to(out.dtype))
        return
    out.index_add_(0, g.out_rows, (flat if g.out_pos is None else flat[g.out_pos]).to(out.dtype))
