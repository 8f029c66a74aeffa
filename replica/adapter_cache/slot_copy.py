"""Slot writes: a RAM entry's buffer into one slot row of an arena, following the row plan's runs.

Semantics (what both functions do; plan from RowLayout.plan(entry.targets)):
    for row_off, buf_off, n in plan.copies:        row[row_off : row_off + n] = flat[buf_off : buf_off + n]
    for row_off, n in plan.zeros:                  row[row_off : row_off + n] = 0
    for j, i, n in plan.scale_copies:              row_scales[j : j + n] = scales[i : i + n]
    for j, n in plan.scale_zeros:                  row_scales[j : j + n] = 0

run_host: arenas in host memory (CPU replicas): a run of at least BIG_RUN_BYTES is a torch copy_ (which
splits a large copy over the intra-op threads: one memmove thread is half as fast on two cores), a smaller
one a memmove/memset, a C call that releases the GIL (torch's per-op dispatch would cost as much as the
bytes of a small run). run_device: the same as
copy_/zero_ on the current stream; from a pinned buffer each copy is an asynchronous host-to-device
transfer straight into the slot row (no staging buffer).
"""

from __future__ import annotations

import ctypes

import torch

from replica.lora.row_layout import RowPlan

BIG_RUN_BYTES = 1 << 18


def _check(row: torch.Tensor, row_scales: torch.Tensor, flat: torch.Tensor, scales: torch.Tensor) -> None:
    if flat.dtype != row.dtype or scales.dtype != torch.float32 or row_scales.dtype != torch.float32:
        raise ValueError("the buffer must have the slot dtype and fp32 scales")
    for t in (row, row_scales, flat, scales):
        if not t.is_contiguous():
            raise ValueError("slot rows and RAM buffers must be contiguous")


def run_host(
    plan: RowPlan, row: torch.Tensor, row_scales: torch.Tensor, flat: torch.Tensor, scales: torch.Tensor
) -> None:
    """row [row_numel] and row_scales [num_modules] in host memory; flat [plan.numel]; scales [num_scales]."""
    _check(row, row_scales, flat, scales)
    move, fill = ctypes.memmove, ctypes.memset
    for dst_t, src_t, item, copies, zeros in (
        (row, flat, row.element_size(), plan.copies, plan.zeros),
        (row_scales, scales, 4, plan.scale_copies, plan.scale_zeros),
    ):
        big = BIG_RUN_BYTES // item
        dst, src = dst_t.data_ptr(), src_t.data_ptr()
        for row_off, buf_off, n in copies:
            if n >= big:
                dst_t[row_off : row_off + n].copy_(src_t[buf_off : buf_off + n])
            else:
                move(dst + row_off * item, src + buf_off * item, n * item)
        for row_off, n in zeros:
            if n >= big:
                dst_t[row_off : row_off + n].zero_()
            else:
                fill(dst + row_off * item, 0, n * item)


def run_device(
    plan: RowPlan, row: torch.Tensor, row_scales: torch.Tensor, flat: torch.Tensor, scales: torch.Tensor
) -> None:
    """The same with torch ops on the current stream (row on the device; flat pinned for async copies)."""
    _check(row, row_scales, flat, scales)
    for dst, src, copies, zeros in (
        (row, flat, plan.copies, plan.zeros),
        (row_scales, scales, plan.scale_copies, plan.scale_zeros),
    ):
        for row_off, buf_off, n in copies:
            dst[row_off : row_off + n].copy_(src[buf_off : buf_off + n], non_blocking=True)
        for row_off, n in zeros:
            dst[row_off : row_off + n].zero_()
