"""The torch (CPU) adapter path for one-token rows on mostly distinct adapters: each row reads its own slot.

Where rows rarely share an adapter (a decode batch of 32 rows on 32 adapters), grouping rows by slot buys
nothing, since every adapter is read once either way, and costs a dozen operators per adapted linear.
Instead each row's A, B and scale are gathered (replica.lora.layer_gather gathers a whole layer of them at
once) and one batched multiply a side computes the reference's own form (replica.kernels.reference):

    t[i]    = (A[safe[i]] @ x[i]) * scale[safe[i]] * keep[i]
    out[i] += B[safe[i]] @ t[i]

safe[i] is the row's slot (0 for a row without an adapter in this pool, whose keep[i] is 0), built once per
forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.kernels.grouped import compute_dtype


@dataclass(frozen=True, eq=False)  # identity: a layer gather knows the rows it holds by this object
class GatheredRows:
    """Per-row slot indices of one batch for one rank bucket."""

    safe: torch.Tensor  # [num_tokens] long: the row's slot, 0 where it has none in this pool
    keep: torch.Tensor  # [num_tokens, 1] fp32: 1 where the row has an adapter in this pool, else 0


def build_gathered(slot_of_row: torch.Tensor) -> GatheredRows:
    """Row indices for the gathered path."""
    # slot_of_row [num_tokens] int32/int64, values in [-1, num_slots)
    return GatheredRows(slot_of_row.clamp(min=0).long(), (slot_of_row >= 0).float().unsqueeze(1))


def mostly_distinct(slot_of_row: torch.Tensor) -> bool:
    """True when the batch has more than half as many distinct adapters as rows: the gathered path's case
    (it also gathers a slot for each row without one, so those rows count against it)."""
    slots = slot_of_row[slot_of_row >= 0]
    return 2 * int(slots.unique().numel()) > int(slot_of_row.numel())


def gathered_term(
    x: torch.Tensor, out: torch.Tensor, a_t: torch.Tensor, b_t: torch.Tensor, scale: torch.Tensor
) -> None:
    """out[i] += B_i @ (A_i @ x[i]) * scale[i] in place, for each row's own gathered A_i, B_i and scale."""
    # x [n, in]; out [n, out_features] (may be a slice of a wider output); a_t [n, in, rank] (A_i^T);
    # b_t [n, rank, out_features] (B_i^T); scale [n, 1, 1] fp32, 0 for rows to leave untouched
    t = torch.bmm(compute_dtype(x).unsqueeze(1), a_t).mul_(scale)  # [n, 1, rank]
    delta = torch.bmm(t, b_t)  # [n, 1, out_features]
    out.unsqueeze(1).add_(delta if delta.dtype == out.dtype else delta.to(out.dtype))


def indexed_term(
    x: torch.Tensor,
    out: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    rows: GatheredRows,
) -> None:
    """The same term as products and sums over each row's slot read in place: the form a compiled step
    fuses into one loop a side, with no gathered copy of the adapters (eager torch would copy them)."""
    # x [n, in]; out [n, out_features]; a_stack [S, rank, in]; b_stack [S, out_features, rank]; scale [S]
    s = (scale[rows.safe].unsqueeze(1) * rows.keep).unsqueeze(2)  # [n, 1, 1]
    t = (compute_dtype(a_stack[rows.safe]) * compute_dtype(x).unsqueeze(1) * s).sum(-1)  # [n, rank]
    delta = (compute_dtype(b_stack[rows.safe]) * t.unsqueeze(1)).sum(-1)  # [n, out_features]
    out.add_(delta.to(out.dtype))
