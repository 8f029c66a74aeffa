"""Slot writes into an arena row: memmove runs and torch-copied big runs give the same row as the plan says."""

from __future__ import annotations

import random

import pytest
import torch

from replica.adapter_cache import slot_copy
from replica.lora.row_layout import RowLayout

ROW = RowLayout.for_modules(4, {(layer, name): (8, 6) for layer in range(3) for name in ("q_proj", "v_proj")})


def expected(targets: tuple, flat: torch.Tensor) -> torch.Tensor:
    row, cursor = torch.zeros(ROW.row_numel), 0
    for key in targets:
        j, n = ROW.index[key], ROW.module_numel(key)
        row[ROW.offsets[j] : ROW.offsets[j] + n] = flat[cursor : cursor + n]
        cursor += n
    return row


@pytest.mark.parametrize(
    "host, big_run_bytes, spans",
    [(True, 0, 1), (True, 1 << 30, 1), (False, 0, 1), (True, 1 << 30, 7), (False, 0, 5)],
    ids=["host_torch_copies", "host_memmoves", "device_ops", "host_in_spans", "device_in_spans"],
)
@pytest.mark.parametrize("seed", range(8))
def test_a_slot_write_follows_the_plan(
    seed: int, host: bool, big_run_bytes: int, spans: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device ops run on CPU tensors here; spans: the buffer handed over in pieces, as a file read lands."""
    monkeypatch.setattr(slot_copy, "BIG_RUN_BYTES", big_run_bytes)
    rng = random.Random(seed)
    targets = tuple(k for k, _, _ in ROW.modules if rng.random() < 0.6)
    plan = ROW.plan(targets)
    flat, scales = torch.randn(plan.numel), torch.rand(len(targets)) + 0.5
    row, row_scales = torch.full((ROW.row_numel,), 7.0), torch.full((len(ROW.modules),), 7.0)  # stale slot
    cuts = sorted({0, plan.numel, *(rng.randrange(plan.numel + 1) for _ in range(spans - 1))})
    slot_copy.zero_gaps(plan, row, row_scales, host)
    for lo, hi in reversed(list(zip(cuts, cuts[1:], strict=False))):  # any order
        slot_copy.copy_span(plan, row, flat, lo, hi, host)
    slot_copy.copy_scales(plan, row_scales, scales, host)
    assert torch.equal(row, expected(targets, flat))
    want_scales = torch.zeros(len(ROW.modules))
    for n, key in enumerate(targets):
        want_scales[ROW.index[key]] = scales[n]
    assert torch.equal(row_scales, want_scales)


def test_a_buffer_of_another_dtype_or_a_strided_row_is_refused() -> None:
    plan = ROW.plan(tuple(k for k, _, _ in ROW.modules))
    flat, scales = torch.randn(plan.numel), torch.ones(len(ROW.modules))
    row_scales = torch.zeros(len(ROW.modules))
    with pytest.raises(ValueError, match="slot dtype"):
        slot_copy.check(torch.zeros(ROW.row_numel), row_scales, flat.half(), scales)
    with pytest.raises(ValueError, match="contiguous"):
        slot_copy.check(torch.zeros(ROW.row_numel, 2)[:, 0], row_scales, flat, scales)
