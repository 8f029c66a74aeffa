"""The torch (CPU) adapter path for one-token rows on mostly distinct adapters: each row reads its own slot.

Where rows rarely share an adapter (a decode batch of 32 rows on 32 adapters), grouping rows by slot buys
nothing, since every adapter is read once either way, and costs a dozen operators per adapted linear.
Instead each row's A, B and scale are gathered (replica.lora.layer_gather gathers a whole layer of them at
once) and one batched multiply a side computes the reference's own form (replica.kernels.reference):

    t[i]    = (A[safe[i]] @ x[i]) * scale[safe[i]] * keep[i]
    out[i] += B[safe[i]] @ t[i]

safe[i] is the row's slot; a row without an adapter in this pool reads a slot another row of the batch holds,
and its keep[i] is 0 and its t[i] zeroed. Built once per forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.kernels.grouped import compute_dtype


@dataclass(frozen=True, eq=False)  # identity: a layer gather knows the rows it holds by this object
class GatheredRows:
    """Per-row slot indices of one batch for one rank bucket."""

    safe: torch.Tensor  # [num_tokens] long: the row's slot; where it has none, a slot another row holds
    keep: torch.Tensor  # [num_tokens, 1] fp32: 1 where the row has an adapter in this pool, else 0
    empty: torch.Tensor  # [num_tokens, 1, 1] bool: the row has no adapter in this pool


def build_gathered(slot_of_row: torch.Tensor) -> GatheredRows:
    """Row indices for the gathered path. A row without a slot here reads the batch's largest slot, which a
    row of the batch holds (so it is pinned, and no loader is writing it), and its term is zeroed."""
    # slot_of_row [num_tokens] int32/int64, values in [-1, num_slots)
    valid = slot_of_row >= 0
    safe = torch.where(valid, slot_of_row, slot_of_row.max().clamp(min=0)).long()
    return GatheredRows(safe, valid.float().unsqueeze(1), (~valid).view(-1, 1, 1))


def is_mostly_distinct(distinct: int, rows: int) -> bool:
    """True when a batch of rows (padding and rows without an adapter here included: the gathered path
    copies a slot for each) holds more than half as many distinct adapters: the gathered path's case."""
    return 2 * distinct > rows


def mostly_distinct(slot_of_row: torch.Tensor) -> bool:
    """is_mostly_distinct, counted on the device from the rows' slots (-1: none in this pool)."""
    slots = slot_of_row[slot_of_row >= 0]
    return is_mostly_distinct(int(slots.unique().numel()), int(slot_of_row.numel()))


def gathered_term(
    x: torch.Tensor,
    out: torch.Tensor,
    a_t: torch.Tensor,
    b_t: torch.Tensor,
    scale: torch.Tensor,
    empty: torch.Tensor,
) -> None:
    """out[i] += B_i @ (A_i @ x[i]) * scale[i] in place, for each row's own gathered A_i, B_i and scale."""
    # x [n, in]; out [n, out_features] (may be a slice of a wider output); a_t [n, in, rank] (A_i^T);
    # b_t [n, rank, out_features] (B_i^T); scale [n, 1, 1] fp32, 0 for rows to leave untouched;
    # empty [n, 1, 1] bool: rows whose t is zeroed outright, so another row's A cannot overflow into them
    t = torch.bmm(compute_dtype(x).unsqueeze(1), a_t).mul_(scale).masked_fill_(empty, 0.0)  # [n, 1, rank]
    delta = torch.bmm(t, b_t)  # [n, 1, out_features]
    out.unsqueeze(1).add_(delta if delta.dtype == out.dtype else delta.to(out.dtype))
