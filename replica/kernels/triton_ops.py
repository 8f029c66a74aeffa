"""Public Triton entry points for the adapter path; semantics of reference.lora_shrink_ref / lora_expand_ref.

How a caller (replica/kernels/ops.py) uses them on CUDA tensors:

    from replica.kernels import triton_ops
    from replica.kernels.segments import build_segments

    # decode step (one row per sequence): gathered launch, no metadata
    t = triton_ops.lora_shrink(x, a_stack, slot_of_row)                     # t [num_tokens, rank]
    triton_ops.lora_expand(out, t, b_stack, scale, slot_of_row)             # out += delta, in place

    # prefill (many rows per adapter): build segments once per forward pass, reuse them in every layer
    segments = build_segments(slot_of_row)                                  # one host sync
    t = triton_ops.lora_shrink(x, a_stack, slot_of_row, segments)
    triton_ops.lora_expand(out, t, b_stack, scale, slot_of_row, segments)

Shapes: x [num_tokens, hidden_in], a_stack [num_slots, rank, hidden_in],
b_stack [num_slots, hidden_out, rank], scale [num_slots], slot_of_row [num_tokens] int32/int64 (-1: none),
out [num_tokens, hidden_out].
x, a_stack, t, out and b_stack share one dtype (fp16, bf16 or fp32); accumulation is fp32. x and out may be
row-strided views (last dim contiguous); stacks, t, scale and slot_of_row must be contiguous. Bad inputs raise
ValueError. Segments depend only on slot_of_row, so one Segments object serves every pool and layer of a pass
that shares that slot_of_row. Import this module only where Triton can run: a CUDA device, or CPU tensors
with TRITON_INTERPRET=1 set before the first import of triton (the tests do that).

Semantics (the torch loop both launch shapes equal):

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
