"""ops dispatch: the CPU paths equal the per-row loop for every shape of batch, and pick the gathered layout for
decode rows on mostly distinct adapters."""

from __future__ import annotations

import pytest
import torch

from replica.kernels import ops
from replica.kernels.gathered import GatheredRows
from replica.kernels.grouped import GroupedRows, build_grouped
from replica.kernels.reference import lora_loop_ref


def _slots(pattern: str, n: int, s: int, gen: torch.Generator) -> torch.Tensor:
    if pattern == "random_with_base":
        return torch.randint(-1, s, (n,), generator=gen, dtype=torch.int32)
    if pattern == "one_adapter_in_order":
        return torch.full((n,), s - 1, dtype=torch.int32)
    if pattern == "all_distinct":
        return torch.randperm(s, generator=gen)[:n].to(torch.int32)
    if pattern == "skewed":  # a long prefill on one adapter beside decode rows on others
        slots = torch.full((n,), 2, dtype=torch.int32)
        slots[-4:] = torch.tensor([0, 1, 3, -1], dtype=torch.int32)
        return slots
    if pattern == "all_base":
        return torch.full((n,), -1, dtype=torch.int32)
    raise AssertionError(pattern)


@pytest.mark.parametrize(
    ("pattern", "n"),
    [
        ("random_with_base", 37),
        ("random_with_base", 300),
        ("one_adapter_in_order", 9),
        ("all_distinct", 5),
        ("skewed", 41),
        ("all_base", 6),
        ("random_with_base", 1),
    ],
)
@pytest.mark.parametrize("with_layout", [True, False])
def test_torch_path_equals_loop(pattern: str, n: int, with_layout: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    k, d, r, s = 48, 40, 16, 5
    x = torch.randn(n, k, generator=gen)
    a, b = torch.randn(s, r, k, generator=gen), torch.randn(s, d, r, generator=gen)
    scale = torch.rand(s, generator=gen) + 0.5
    slots = _slots(pattern, n, s, gen)
    out = torch.randn(n, d, generator=gen)
    expected = out + lora_loop_ref(x, a, b, scale, slots)
    layout = ops.prepare(slots) if with_layout else None
    t = ops.lora_shrink(x, a, slots, layout)
    assert torch.all(t[slots < 0] == 0)
    ops.lora_expand(out, t, b, scale, slots, layout)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    assert ops.implementation_for(torch.device("cpu")) == "torch"


@pytest.mark.parametrize("one_adapter", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_fp32(dtype: torch.dtype, one_adapter: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    n, k, d, r, s = 12, 32, 24, 8, 3
    x = torch.randn(n, k, generator=gen).to(dtype)
    a, b = torch.randn(s, r, k, generator=gen).to(dtype), torch.randn(s, d, r, generator=gen).to(dtype)
    scale = torch.rand(s, generator=gen) + 0.5
    slots = torch.randint(-1, s, (n,), generator=gen, dtype=torch.int32)
    if one_adapter:
        slots = torch.full((n,), 1, dtype=torch.int32)
    out = torch.zeros(n, d, dtype=dtype)
    ops.lora_expand(out, ops.lora_shrink(x, a, slots), b, scale, slots)
    expected = lora_loop_ref(x, a, b, scale, slots)
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)
    assert out.dtype == dtype


def test_grouping_bounds_chunks_and_padding() -> None:
    """Chunks stay within twice the distinct adapters and padding within twice the rows, however skewed."""
    slots = torch.tensor([7] * 100 + list(range(31)) + [-1, -1], dtype=torch.int32)
    g = build_grouped(slots)
    assert g is not None
    distinct, valid = 32, 131
    assert g.num_chunks <= 2 * distinct and g.num_chunks * g.width <= 2 * valid
    assert sorted(g.out_rows.tolist()) == list(range(131))  # every row with an adapter exactly once
    for chunk in range(g.num_chunks):  # every real position of a chunk uses the chunk's slot
        rows = g.gather[chunk]
        real = [int(r) for j, r in enumerate(rows) if g.out_pos is None or chunk * g.width + j in g.out_pos]
        assert all(int(slots[r]) == int(g.chunk_slot[chunk]) for r in real)
    assert build_grouped(torch.full((3,), -1, dtype=torch.int32)) is None


def test_one_adapter_over_every_row_uses_views() -> None:
    g = build_grouped(torch.full((8,), 3, dtype=torch.int32))
    assert g is not None and g.in_order and g.single_slot == 3 and g.num_chunks == 1
    mixed = build_grouped(torch.tensor([3, -1, 3], dtype=torch.int32))
    assert mixed is not None and not mixed.in_order and mixed.single_slot == 3


def test_decode_batches_of_distinct_adapters_gather_and_shared_ones_group() -> None:
    distinct = torch.tensor([4, 0, -1, 2, 3, 1], dtype=torch.int32)
    assert isinstance(ops.prepare(distinct), GatheredRows)
    assert isinstance(ops.prepare(torch.tensor([1, 1, 1, 2, -1], dtype=torch.int32)), GroupedRows)
    one_of_many = torch.full((32,), -1, dtype=torch.int32)
    one_of_many[5] = 3  # one adapted row among base rows: gathering would copy a slot for every row
    assert isinstance(ops.prepare(one_of_many), GroupedRows)
    assert isinstance(ops.prepare(distinct, segmented=True), GroupedRows)  # prefill rows share by prompt


def test_a_gathered_layout_given_to_the_ops_groups_the_rows_instead() -> None:
    """Only an adapted layer's arena serves the gathered layout (tests/replica/lora/test_layer_gather.py);
    the ops given one still equal the loop."""
    gen = torch.Generator().manual_seed(2)
    x, a, b = (
        torch.randn(6, 32, generator=gen),
        torch.randn(6, 8, 32, generator=gen),
        torch.randn(6, 24, 8, generator=gen),
    )
    scale = torch.rand(6, generator=gen) + 0.5
    slots = torch.tensor([5, -1, 0, 3, 2, 4], dtype=torch.int32)
    layout = ops.prepare(slots)
    assert isinstance(layout, GatheredRows)
    out = torch.zeros(6, 24)
    ops.lora_expand(out, ops.lora_shrink(x, a, slots, layout), b, scale, slots, layout)
    torch.testing.assert_close(out, lora_loop_ref(x, a, b, scale, slots), atol=1e-4, rtol=1e-4)
    assert ops.prepare(slots, distinct=False) is not None and isinstance(
        ops.prepare(slots, distinct=False), GroupedRows
    )
