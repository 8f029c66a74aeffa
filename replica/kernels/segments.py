"""Segment metadata for the prefill launch: batch rows grouped by slot, so each adapter is read once per tile.

Build it once per forward pass (it costs one host sync) and pass the same object to every adapted layer:

    segments = build_segments(slot_of_row)            # slot_of_row [num_tokens] int, on the batch's device
    t = lora_shrink(x, a_stack, slot_of_row, segments)

Rows are sorted by slot with a stable sort; `perm` lists the original row indices in that order, and the
segment table holds one entry per distinct slot that is not -1. Rows with slot -1 belong to no segment:
the kernels leave them alone (zeros in t, `out` untouched).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segments:
    """Rows of one batch grouped by slot; all tensors int32 on the batch's device."""

    perm: torch.Tensor  # [num_tokens] original row index of each sorted position
    seg_slot: torch.Tensor  # [num_segments] slot of each segment (never -1)
    seg_start: torch.Tensor  # [num_segments] first sorted position of each segment
    seg_len: torch.Tensor  # [num_segments] rows in each segment
    num_tokens: int
    num_segments: int
    max_len: int  # rows in the longest segment; sizes the launch grid

    def as_list(self) -> list[tuple[int, int, int]]:
        """Return (slot, start, length) per segment, for logs and tests."""
        return list(zip(self.seg_slot.tolist(), self.seg_start.tolist(), self.seg_len.tolist(), strict=True))


def build_segments(slot_of_row: torch.Tensor) -> Segments:
    """Sort rows by slot (stable) and record one (slot, start, length) entry per adapter in the batch."""
    # slot_of_row [num_tokens] int32/int64, values in [-1, num_slots)
    if slot_of_row.dim() != 1:
        raise ValueError(f"slot_of_row must be 1-D [num_tokens], got shape {tuple(slot_of_row.shape)}")
    if slot_of_row.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_of_row must be int32 or int64, got {slot_of_row.dtype}")
    device = slot_of_row.device
    num_tokens = slot_of_row.shape[0]
    sorted_slots, perm = torch.sort(slot_of_row, stable=True)  # [num_tokens], [num_tokens]
    slots, counts = torch.unique_consecutive(sorted_slots, return_counts=True)  # [num_distinct] each
    starts = torch.cumsum(counts, dim=0) - counts  # [num_distinct]
    keep = slots >= 0  # the -1 group, if any, is first after the sort; it gets no segment
    seg_slot = slots[keep].to(torch.int32)
    seg_start = starts[keep].to(torch.int32)
    seg_len = counts[keep].to(torch.int32)
    num_segments = int(seg_slot.shape[0])
    max_len = int(seg_len.max().item()) if num_segments else 0
    return Segments(
        perm=perm.to(torch.int32).to(device),
        seg_slot=seg_slot,
        seg_start=seg_start,
        seg_len=seg_len,
        num_tokens=num_tokens,
        num_segments=num_segments,
        max_len=max_len,
    )
