"""The adapter-path entry points layers call; the implementation is chosen from a table by device.

Semantics (every implementation equals replica.kernels.reference):
    lora_shrink: t[i] = a_stack[s_i] @ x[i]                      (zeros where s_i == -1)
    lora_expand: out[i] += scale[s_i] * (b_stack[s_i] @ t[i])    (untouched where s_i == -1)

On CUDA, with replica.kernels.triton_ops importable, the Triton kernels run. Elsewhere a torch path
runs: when rows outnumber the distinct slots in use by DENSE_ROWS_PER_SLOT (prefill), one matmul against
just those slots; otherwise (decode) the reference's per-row gather, in row chunks of at most CHUNK_BYTES.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from replica.kernels.reference import lora_expand_ref, lora_shrink_ref
from replica.kernels.segments import Segments

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20
DENSE_ROWS_PER_SLOT = 4  # prefill-like batches: multiply by the used slots instead of gathering per row


def _rows_per_chunk(stack: torch.Tensor) -> int:
    per_row = stack.shape[1] * stack.shape[2] * 4  # gathered [rank, hidden] (or [hidden, rank]) in fp32
    return max(1, CHUNK_BYTES // per_row)


def _dense_over_used_slots(n: int, slot_of_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """When many rows share few slots (prefill), return (used slots, row -> index in used); else None."""
    used, inverse = torch.unique(slot_of_row, return_inverse=True)  # [num_used], [num_tokens]
    if n < DENSE_ROWS_PER_SLOT * used.numel():
        return None
    return used.clamp(min=0).long(), inverse


def _torch_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, segments: Segments | None = None
) -> torch.Tensor:
    # x [num_tokens, hidden_in]; a_stack [num_slots, rank, hidden_in] -> t [num_tokens, rank]
    n, rank = x.shape[0], a_stack.shape[1]
    dense = _dense_over_used_slots(n, slot_of_row)
    if dense is not None:  # one matmul against the few slots in use, no per-row gather of A
        used, inverse = dense
        a_used = a_stack[used].float().reshape(-1, a_stack.shape[2])  # [num_used * rank, hidden_in]
        t_all = (x.float() @ a_used.T).view(n, used.numel(), rank)  # [num_tokens, num_used, rank]
        t = t_all.gather(1, inverse.view(n, 1, 1).expand(n, 1, rank)).squeeze(1)  # [num_tokens, rank]
        return (t * (slot_of_row >= 0).unsqueeze(-1)).to(x.dtype)
    step = _rows_per_chunk(a_stack)
    parts = [lora_shrink_ref(x[i : i + step], a_stack, slot_of_row[i : i + step]) for i in range(0, n, step)]
    return torch.cat(parts)


def _torch_expand(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    segments: Segments | None = None,
) -> None:
    # out [num_tokens, hidden_out] (in place); t [num_tokens, rank]; b_stack [num_slots, hidden_out, rank]
    n, rank = out.shape[0], b_stack.shape[2]
    dense = _dense_over_used_slots(n, slot_of_row)
    if dense is not None:
        used, inverse = dense
        valid = slot_of_row >= 0
        row_scale = scale[slot_of_row.clamp(min=0).long()].float() * valid  # [num_tokens]
        t_full = torch.zeros(n, used.numel(), rank, dtype=torch.float32, device=out.device)
        t_full[torch.arange(n, device=out.device), inverse] = t.float() * row_scale.unsqueeze(-1)
        b_used = (
            b_stack[used].float().permute(1, 0, 2).reshape(b_stack.shape[1], -1)
        )  # [hidden_out, used*rank]
        out.add_((t_full.view(n, -1) @ b_used.T).to(out.dtype))
        return
    step = _rows_per_chunk(b_stack)
    for i in range(0, n, step):
        lora_expand_ref(out[i : i + step], t[i : i + step], b_stack, scale, slot_of_row[i : i + step])


def _triton() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        mod = importlib.import_module("replica.kernels.triton_ops")
    except Exception as exc:  # no triton, no GPU driver, or the module not there yet
        log.info("Triton LoRA kernels unavailable (%s); using the torch reference", exc)
        return None
    return mod.lora_shrink, mod.lora_expand


IMPLEMENTATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "torch": (_torch_shrink, _torch_expand)
}
_triton_impl = _triton() if torch.cuda.is_available() else None
if _triton_impl is not None:
    IMPLEMENTATIONS["triton"] = _triton_impl
DEVICE_IMPLEMENTATION: dict[str, str] = {
    "cuda": "triton" if "triton" in IMPLEMENTATIONS else "torch",
    "cpu": "torch",
}


def implementation_for(device: torch.device) -> str:
    """Name of the implementation used for tensors on this device."""
    return DEVICE_IMPLEMENTATION.get(device.type, "torch")


def lora_shrink(
    x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor, segments: Segments | None = None
) -> torch.Tensor:
    """t [num_tokens, rank] = a_stack[slot] @ x per row; zeros for slot -1."""
    return IMPLEMENTATIONS[implementation_for(x.device)][0](x, a_stack, slot_of_row, segments)


def lora_expand(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
    segments: Segments | None = None,
) -> None:
    """out[i] += scale[slot] * b_stack[slot] @ t[i] in place; rows with slot -1 untouched."""
    IMPLEMENTATIONS[implementation_for(out.device)][1](out, t, b_stack, scale, slot_of_row, segments)
