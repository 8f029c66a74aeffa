"""Input checks shared by the kernel launchers; each raises ValueError naming the bad argument."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SLOT_DTYPES = (torch.int32, torch.int64)


def check_float(name: str, tensor: torch.Tensor) -> None:
    """Require fp16, bf16 or fp32."""
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {tensor.dtype}")


def check_rows(name: str, tensor: torch.Tensor) -> None:
    """Require a 2-D [num_tokens, hidden] tensor whose last dimension is contiguous."""
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_tokens, hidden], got shape {tuple(tensor.shape)}")
    if tensor.shape[1] > 1 and tensor.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tensor.stride()}")


def check_stack(name: str, tensor: torch.Tensor) -> None:
    """Require a 3-D slot stack [num_slots, p, q] whose slots are each contiguous (any slot stride, as in a
    slot arena's views); the kernels take stride(0)."""
    if tensor.dim() != 3:
        raise ValueError(f"{name} must be 3-D [num_slots, *, *], got shape {tuple(tensor.shape)}")
    _, p, q = tensor.shape
    if not ((q <= 1 or tensor.stride(2) == 1) and (p <= 1 or tensor.stride(1) == q)):
        raise ValueError(f"{name} must have contiguous slots, got strides {tensor.stride()}")


def check_slots(slot_of_row: torch.Tensor, num_tokens: int) -> None:
    """Require slot_of_row [num_tokens] int32/int64, contiguous."""
    if slot_of_row.dim() != 1 or slot_of_row.shape[0] != num_tokens:
        raise ValueError(f"slot_of_row must have shape [{num_tokens}], got {tuple(slot_of_row.shape)}")
    if slot_of_row.dtype not in SLOT_DTYPES:
        raise ValueError(f"slot_of_row must be int32 or int64, got {slot_of_row.dtype}")
    if not slot_of_row.is_contiguous():
        raise ValueError("slot_of_row must be contiguous")


def check_same_device(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    """Require tensor on the same device as like."""
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device}, expected {like.device}")
