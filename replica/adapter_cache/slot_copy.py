"""Slot writes: a RAM entry's buffer into one slot row of an arena, following the row plan's runs.

Semantics (plan from RowLayout.plan(entry.targets)); a whole write (GpuTier.begin, copy_span, finish) does
the three steps in order:
    zero_gaps:    for row_off, n in plan.zeros:               row[row_off : row_off + n] = 0
                  for j, n in plan.scale_zeros:               row_scales[j : j + n] = 0
    copy_span:    for row_off, buf_off, n in plan.copies, the part of flat[buf_off : buf_off + n] that
                  lies in flat[lo:hi] goes to the same place in row[row_off : row_off + n]
    copy_scales:  for j, i, n in plan.scale_copies:           row_scales[j : j + n] = scales[i : i + n]
copy_span over consecutive spans that cover flat writes what one copy_span(0, plan.numel) writes, so a
reader can hand over each chunk of a file as it lands (AdapterCache's disk path).

host=True (arenas in host memory, CPU replicas): a run of at least BIG_RUN_BYTES is a torch copy_ (which
splits a large copy over the intra-op threads: one memmove thread is half as fast on two cores), a smaller
one a memmove/memset, a C call that releases the GIL (torch's per-op dispatch would cost as much as the
bytes of a small run). host=False: copy_/zero_ on the current stream; from a pinned buffer each copy is an
asynchronous host-to-device transfer straight into the slot row (no staging buffer).
"""

from __future__ import annotations

import ctypes

import torch

from replica.lora.row_layout import RowPlan

BIG_RUN_BYTES = 1 << 18


def check(row: torch.Tensor, row_scales: torch.Tensor, flat: torch.Tensor, scales: torch.Tensor) -> None:
    if flat.dtype != row.dtype or scales.dtype != torch.float32 or row_scales.dtype != torch.float32:
        raise ValueError("the buffer must have the slot dtype and fp32 scales")
    for t in (row, row_scales, flat, scales):
        if not t.is_contiguous():
            raise ValueError("slot rows and RAM buffers must be contiguous")


def _copy(dst: torch.Tensor, d: int, src: torch.Tensor, s: int, n: int, host: bool) -> None:
    """dst[d : d + n] = src[s : s + n] (1-D, same dtype)."""
    item = dst.element_size()
    if host and n * item < BIG_RUN_BYTES:
        ctypes.memmove(dst.data_ptr() + d * item, src.data_ptr() + s * item, n * item)
    else:
        dst[d : d + n].copy_(src[s : s + n], non_blocking=not host)


def _zero(dst: torch.Tensor, d: int, n: int, host: bool) -> None:
    item = dst.element_size()
    if host and n * item < BIG_RUN_BYTES:
        ctypes.memset(dst.data_ptr() + d * item, 0, n * item)
    else:
        dst[d : d + n].zero_()


def zero_gaps(plan: RowPlan, row: torch.Tensor, row_scales: torch.Tensor, host: bool) -> None:
    """Zero the row's modules the buffer does not hold, and their scales."""
    for row_off, n in plan.zeros:
        _zero(row, row_off, n, host)
    for j, n in plan.scale_zeros:
        _zero(row_scales, j, n, host)


def copy_span(plan: RowPlan, row: torch.Tensor, flat: torch.Tensor, lo: int, hi: int, host: bool) -> None:
    """Copy flat[lo:hi] (elements of the packed buffer) to where the plan puts them in the row."""
    for row_off, buf_off, n in plan.copies:
        start, end = max(lo, buf_off), min(hi, buf_off + n)
        if start < end:
            _copy(row, row_off + start - buf_off, flat, start, end - start, host)


def copy_scales(plan: RowPlan, row_scales: torch.Tensor, scales: torch.Tensor, host: bool) -> None:
    for j, i, n in plan.scale_copies:
        _copy(row_scales, j, scales, i, n, host)
