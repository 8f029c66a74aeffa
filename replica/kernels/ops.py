"""The adapter-path entry points layers call; the implementation is chosen from a table by device.

Semantics (every implementation equals replica.kernels.reference):
    lora_shrink: t[i] = a_stack[s_i] @ x[i]                      (zeros where s_i == -1)
    lora_expand: out[i] += scale[s_i] * (b_stack[s_i] @ t[i])    (untouched where s_i == -1)

Once per forward pass and rank bucket, prepare(slot_of_row, segmented) builds the implementation's row
layout, and every adapted layer passes it back to lora_shrink / lora_expand:
- on CUDA, with replica.kernels.triton_ops importable, the Triton kernels run; their layout is the prefill
  Segments (None for the per-row decode launch);
- elsewhere the torch path runs: rows grouped by slot, one bmm per layer (replica.kernels.grouped), or,
  for a decode batch where few rows share an adapter, each row gathering its own (replica.kernels.gathered);
  the adapted layer serves that layout, gathering a layer's slots at once (replica.lora.layer_gather), and
  lora_shrink / lora_expand given it group the rows instead.
A layout of None is always accepted: the implementation then derives what it needs from slot_of_row.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from replica.kernels.gathered import GatheredRows, build_gathered, mostly_distinct
from replica.kernels.grouped import GroupedRows, build_grouped, grouped_expand, grouped_shrink
from replica.kernels.segments import Segments, build_segments

log = logging.getLogger(__name__)

Layout = Segments | GroupedRows | GatheredRows | None


def _grouped_for(slot_of_row: torch.Tensor, layout: Layout) -> GroupedRows | None:
    """The torch path's row grouping: the one prepared for this step, or built now (tests, one-off calls, and
    a gathered layout, which only an adapted layer's arena can serve: replica.lora.layer_gather)."""
    return layout if isinstance(layout, GroupedRows) else build_grouped(slot_of_row)


def _torch_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, layout: Layout = None
) -> torch.Tensor:
    # x [num_tokens, hidden_in]; a_stack [num_slots, rank, hidden_in] -> t [num_tokens, rank]
    return grouped_shrink(x, a_stack, _grouped_for(slot_of_row, layout))


def _torch_expand(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    layout: Layout = None,
) -> None:
    # out [num_tokens, hidden_out] (in place); t [num_tokens, rank]; b_stack [num_slots, hidden_out, rank]
    grouped_expand(out, t, b_stack, scale, _grouped_for(slot_of_row, layout))


def _torch_prepare(slot_of_row: torch.Tensor, segmented: bool, distinct: bool | None) -> Layout:
    """Rows gather their own slot where few share one (each adapter is read once either way), else rows are
    grouped by slot so a shared adapter is read once."""
    if not segmented and (mostly_distinct(slot_of_row) if distinct is None else distinct):
        return build_gathered(slot_of_row)
    return build_grouped(slot_of_row)


def _triton_prepare(slot_of_row: torch.Tensor, segmented: bool, distinct: bool | None) -> Layout:
    return build_segments(slot_of_row) if segmented else None


Implementation = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Layout]]


def _triton() -> Implementation | None:
    try:
        mod = importlib.import_module("replica.kernels.triton_ops")
    except Exception as exc:  # no triton, no GPU driver, or the module not there yet
        log.info("Triton LoRA kernels unavailable (%s); using the torch path", exc)
        return None
    return mod.lora_shrink, mod.lora_expand, _triton_prepare


# One launch per projection over every rank bucket of a decode batch: (bucket_table, shrink, expand) of
# replica.kernels.lora_multi, for implementations that have it.
OneLaunch = tuple[Callable[..., Any], Callable[..., torch.Tensor], Callable[..., None]]


def _triton_one_launch() -> OneLaunch | None:
    try:
        mod = importlib.import_module("replica.kernels.lora_multi")
    except Exception as exc:
        log.info("Triton one-launch LoRA kernels unavailable (%s)", exc)
        return None
    return mod.bucket_table, mod.shrink_multi, mod.expand_multi


IMPLEMENTATIONS: dict[str, Implementation] = {"torch": (_torch_shrink, _torch_expand, _torch_prepare)}
ONE_LAUNCH: dict[str, OneLaunch] = {}
_triton_impl = _triton() if torch.cuda.is_available() else None
if _triton_impl is not None:
    IMPLEMENTATIONS["triton"] = _triton_impl
    _one_launch = _triton_one_launch()
    if _one_launch is not None:
        ONE_LAUNCH["triton"] = _one_launch
DEVICE_IMPLEMENTATION: dict[str, str] = {
    "cuda": "triton" if "triton" in IMPLEMENTATIONS else "torch",
    "cpu": "torch",
}


def implementation_for(device: torch.device) -> str:
    """Name of the implementation used for tensors on this device."""
    return DEVICE_IMPLEMENTATION.get(device.type, "torch")


def one_launch_for(device: torch.device) -> OneLaunch | None:
    """The kernels that cover every rank bucket of a decode batch in one launch, where the device has them."""
    return ONE_LAUNCH.get(implementation_for(device))


def prepare(slot_of_row: torch.Tensor, segmented: bool = False, distinct: bool | None = None) -> Layout:
    """Build the per-step row layout for one rank bucket (segmented: a prefill-shaped batch; distinct:
    whether its rows mostly read distinct slots, where the caller has counted it on the host)."""
    return IMPLEMENTATIONS[implementation_for(slot_of_row.device)][2](slot_of_row, segmented, distinct)


def lora_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, layout: Layout = None
) -> torch.Tensor:
    """t [num_tokens, rank] = a_stack[slot] @ x per row; zeros for slot -1."""
    return IMPLEMENTATIONS[implementation_for(x.device)][0](x, a_stack, slot_of_row, layout)


def lora_expand(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    layout: Layout = None,
) -> None:
    """out[i] += scale[slot] * b_stack[slot] @ t[i] in place; rows with slot -1 untouched."""
    IMPLEMENTATIONS[implementation_for(out.device)][1](out, t, b_stack, scale, slot_of_row, layout)
