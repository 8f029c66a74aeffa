"""Public Triton entry points for the adapter path (how ops.py calls them, shapes and dtypes:
docs/replica.md#kernels).

Semantics (the torch loop both launch shapes equal; reference.lora_shrink_ref / lora_expand_ref):

    for i in range(num_tokens):
        s = slot_of_row[i]
        t[i] = (a_stack[s].float() @ x[i].float()).to(x.dtype) if s >= 0 else 0
        if s >= 0:
            out[i] += (scale[s].float() * (b_stack[s].float() @ t[i].float())).to(out.dtype)
"""

from __future__ import annotations

import torch

from replica.kernels.lora_expand import expand_gathered, expand_segmented
from replica.kernels.lora_shrink import shrink_gathered, shrink_segmented
from replica.kernels.segments import Segments, build_segments

__all__ = ["Segments", "build_segments", "lora_expand", "lora_shrink"]


def lora_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, segments: Segments | None = None
) -> torch.Tensor:
    """Return t [num_tokens, rank]: the gathered launch when segments is None, else the segmented one."""
    if segments is None:
        return shrink_gathered(x, a_stack, slot_of_row)
    return shrink_segmented(x, a_stack, slot_of_row, segments)


def lora_expand(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    segments: Segments | None = None,
) -> None:
    """Add scale[slot] * b_stack[slot] @ t into out in place; gathered if segments is None, else segmented."""
    if segments is None:
        expand_gathered(out, t, b_stack, scale, slot_of_row)
    else:
        expand_segmented(out, t, b_stack, scale, slot_of_row, segments)
