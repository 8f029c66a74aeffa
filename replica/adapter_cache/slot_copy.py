"""Slot writes for slot pools in host memory (CPU replicas): one memmove per tensor from a cached byte plan.

On CPU, torch's per-op dispatch (a few microseconds each) over an adapter's ~630 A, B and scale copies cost
about as much as moving the bytes; memmoves of precomputed (destination, source offset, length) triples run
at memory speed. One thread: splitting the list over two measured no faster on the 2-core development
machine (each memmove is a few microseconds, so the threads queue for the GIL between them). A plan is
built from the same slot views as the device path (GpuTier._plan) and holds them, so the memory its
pointers name stays alive as long as the plan.

Semantics (what run(plan, flat, scales) equals):
    for dst, chunk in zip(dsts, flat.split(chunk_sizes)[picked]): dst.copy_(chunk.view(dst.shape))
    for dst, s in zip(scale_dsts, scales.split(1)): dst.copy_(s)
    for z in zeros: z.zero_()
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

Copy = tuple[int, int, int]  # (destination address, byte offset in the source buffer, bytes)


@dataclass(frozen=True)
class BytePlan:
    keep: tuple[torch.Tensor, ...]  # every slot view the addresses point into
    flat_copies: tuple[Copy, ...]
    scale_copies: tuple[Copy, ...]
    strided: tuple[tuple[torch.Tensor, int, tuple[int, int]], ...]  # padded: (dst, element offset, shape)
    zeros: tuple[torch.Tensor, ...]
    flat_nbytes: int
    scales_nbytes: int
    dtype: torch.dtype


def build(
    zeros: list[torch.Tensor],
    dsts: list[torch.Tensor],
    picks: list[tuple[int, tuple[int, int] | None]],
    scale_dsts: list[torch.Tensor],
    chunk_offsets: list[int],
    flat_numel: int,
    dtype: torch.dtype,
) -> BytePlan:
    """A byte plan from slot views (dsts[i] takes buffer chunk picks[i], at element chunk_offsets[j])."""
    item = dtype.itemsize
    copies: list[Copy] = []
    strided: list[tuple[torch.Tensor, int, tuple[int, int]]] = []
    for dst, (j, shape) in zip(dsts, picks, strict=True):
        assert dst.dtype == dtype and dst.device.type == "cpu"
        if shape is None:
            assert dst.is_contiguous() and chunk_offsets[j] * item + dst.nbytes <= flat_numel * item
            copies.append((dst.data_ptr(), chunk_offsets[j] * item, dst.nbytes))
        else:
            strided.append((dst, chunk_offsets[j], shape))
    scale_copies: list[Copy] = []
    for i, dst in enumerate(scale_dsts):
        assert dst.dtype == torch.float32 and dst.is_contiguous() and dst.numel() == 1
        scale_copies.append((dst.data_ptr(), 4 * i, 4))
    keep = (*dsts, *scale_dsts, *zeros)
    return BytePlan(
        keep, tuple(copies), tuple(scale_copies), tuple(strided), tuple(zeros), flat_numel * item,
        4 * len(scale_dsts), dtype,
    )  # fmt: skip


def run(plan: BytePlan, flat: torch.Tensor, scales: torch.Tensor) -> None:
    """flat [numel] in the slot dtype and scales [num_modules] fp32, both contiguous in host memory."""
    if flat.dtype != plan.dtype or flat.nbytes != plan.flat_nbytes or scales.nbytes != plan.scales_nbytes:
        raise ValueError("the buffer does not have the layout this plan was built for")
    if not (flat.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.float32):
        raise ValueError("slot copies need contiguous fp32 scales and a contiguous buffer")
    move = ctypes.memmove  # a C call that releases the GIL
    base = flat.data_ptr()
    for dst, offset, n in plan.flat_copies:
        move(dst, base + offset, n)
    base = scales.data_ptr()
    for dst, offset, n in plan.scale_copies:
        move(dst, base + offset, n)
    for dst, offset, shape in plan.strided:
        dst.copy_(flat[offset : offset + shape[0] * shape[1]].view(shape))
    if plan.zeros:
        torch._foreach_zero_(list(plan.zeros))
