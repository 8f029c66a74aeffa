"""Per-step LoRA metadata: for each rank bucket present in the batch, the slot of every packed token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replica.kernels import ops
from replica.lora.slots import SlotRef


@dataclass
class LoraBatchMeta:
    """slot_of_row[bucket] [num_tokens] int32: the token's slot in that bucket's pool, -1 when elsewhere.

    layouts[bucket] is the adapter path's row layout for the step (ops.prepare), built once and shared by
    every adapted layer; a missing entry makes the path derive it from slot_of_row.
    """

    slot_of_row: dict[int, torch.Tensor]
    layouts: dict[int, ops.Layout] = field(default_factory=dict)
    # Where set (a decode step on a device with ops.one_launch_for), each row's rank bucket (0: none) and its
    # slot in it, [num_tokens] int32 each: every adapted layer covers all buckets in one launch.
    rows: tuple[torch.Tensor, torch.Tensor] | None = None


def build_batch_meta(
    rows: list[tuple[SlotRef | None, int]], device: torch.device, segmented: bool = False
) -> LoraBatchMeta | None:
    """rows: per sequence in packing order, its slot (None = base only) and its token count this step."""
    buckets = sorted({ref.bucket for ref, _ in rows if ref is not None})
    if not buckets:
        return None
    slot_of_row: dict[int, torch.Tensor] = {}
    for bucket in buckets:
        per_token = [
            ref.index if ref is not None and ref.bucket == bucket else -1 for ref, n in rows for _ in range(n)
        ]
        slot_of_row[bucket] = torch.tensor(per_token, dtype=torch.int32, device=device)  # [num_tokens]
    layouts = {b: ops.prepare(s, segmented) for b, s in slot_of_row.items()}
    return LoraBatchMeta(slot_of_row, layouts)
