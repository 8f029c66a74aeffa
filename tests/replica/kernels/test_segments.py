"""Segment metadata: rows grouped by slot for the prefill launch."""

from __future__ import annotations

import pytest
import torch

from replica.kernels.segments import build_segments


def test_rows_are_grouped_by_slot_in_stable_order() -> None:
    slots = torch.tensor([2, 0, -1, 2, 0, 2, -1], dtype=torch.int32)
    segments = build_segments(slots)
    assert segments.as_list() == [(0, 2, 2), (2, 4, 3)]  # the two -1 rows occupy sorted positions 0 and 1
    assert segments.perm.tolist() == [2, 6, 1, 4, 0, 3, 5]
    assert (segments.num_tokens, segments.num_segments, segments.max_len) == (7, 2, 3)
    assert segments.perm.dtype == segments.seg_slot.dtype == torch.int32


def test_every_row_with_an_adapter_lands_in_its_slots_segment() -> None:
    gen = torch.Generator().manual_seed(0)
    slots = torch.randint(-1, 6, (50,), generator=gen)
    segments = build_segments(slots)
    covered = []
    for slot, start, length in segments.as_list():
        rows = segments.perm[start : start + length]
        assert torch.all(slots[rows.long()] == slot)
        assert rows.tolist() == sorted(rows.tolist())  # stable: original order within a segment
        covered += rows.tolist()
    assert sorted(covered) == [i for i in range(50) if slots[i] >= 0]


def test_batch_without_adapters_has_no_segments() -> None:
    segments = build_segments(torch.full((4,), -1, dtype=torch.int64))
    assert (segments.num_segments, segments.max_len) == (0, 0)
    assert segments.as_list() == []


def test_empty_batch_has_no_segments() -> None:
    segments = build_segments(torch.zeros(0, dtype=torch.int32))
    assert (segments.num_tokens, segments.num_segments) == (0, 0)


def test_rejects_non_integer_or_non_vector_slots() -> None:
    with pytest.raises(ValueError, match="int32 or int64"):
        build_segments(torch.zeros(3))
    with pytest.raises(ValueError, match="1-D"):
        build_segments(torch.zeros(3, 1, dtype=torch.int32))
