"""The torch (CPU) adapter path for batches of mostly distinct adapters: each row gathers its own slot.

Where rows rarely share an adapter (a decode batch of 32 rows on 32 adapters), grouping rows by slot buys
nothing, since every adapter is read once either way, and costs a dozen operators per adapted linear.
Gathering each row's A and B and running one batched multiply is the reference's own form
(replica.kernels.reference) in a handful of operators, with the row indices built once per forward pass:

    shrink: t[i]    = keep[i] * (A[safe[i]] @ x[i])
    expand: out[i] += keep[i] * scale[safe[i]] * (B[safe[i]] @ t[i])

safe[i] is the row's slot (0 for a row without an adapter in this pool, whose keep[i] is 0). The gathers
are index_select, about twice as fast as advanced indexing on the arena's strided slot views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.kernels.grouped import compute_dtype


@dataclass(frozen=True)
class GatheredRows:
    """Per-row slot indices of one batch for one rank bucket."""

    safe: torch.Tensor  # [num_tokens] long: the row's slot, 0 where it has none in this pool
    keep: torch.Tensor  # [num_tokens, 1] fp32: 1 where the row has an adapter in this pool, else 0


def build_gathered(slot_of_row: torch.Tensor) -> GatheredRows:
    """Row indices for the gathered path."""
    # slot_of_row [num_tokens] int32/int64, values in [-1, num_slots)
    valid = slot_of_row >= 0
    return GatheredRows(slot_of_row.long().clamp(min=0), valid.float().unsqueeze(1))


def mostly_distinct(slot_of_row: torch.Tensor) -> bool:
    """True when the batch has more than half as many distinct adapters as rows: the gathered path's case
    (it also gathers a slot for each row without one, so those rows count against it)."""
    slots = slot_of_row[slot_of_row >= 0]
    return 2 * int(slots.unique().numel()) > int(slot_of_row.numel())


def gathered_shrink(x: torch.Tensor, a_stack: torch.Tensor, g: GatheredRows) -> torch.Tensor:
    """t [num_tokens, rank] = A[slot] @ x per row; zeros for rows without an adapter in this pool."""
    # x [num_tokens, hidden_in]; a_stack [num_slots, rank, hidden_in]
    a = compute_dtype(a_stack.index_select(0, g.safe))  # [num_tokens, rank, hidden_in]
    t = torch.bmm(compute_dtype(x).unsqueeze(1), a.transpose(1, 2)).squeeze(1)  # [num_tokens, rank]
    return (t * g.keep).to(x.dtype)


def gathered_expand(
    out: torch.Tensor, t: torch.Tensor, b_stack: torch.Tensor, scale: torch.Tensor, g: GatheredRows
) -> None:
    """out[i] += scale[slot] * B[slot] @ t[i] in place; rows without an adapter in this pool untouched."""
    # out [num_tokens, hidden_out]; t [num_tokens, rank]; b_stack [num_slots, hidden_out, rank]
    b = compute_dtype(b_stack.index_select(0, g.safe))  # [num_tokens, hidden_out, rank]
    delta = torch.bmm(compute_dtype(t).unsqueeze(1), b.transpose(1, 2)).squeeze(1)  # [num_tokens, hidden_out]
    delta.mul_(scale.index_select(0, g.safe).float().unsqueeze(1) * g.keep)
    out.add_(delta.to(out.dtype))
