"""Triton shrink/expand kernels (interpreted on CPU) against the torch reference, both launch shapes."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton; conftest.py sets it too

from types import ModuleType  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from replica.kernels.reference import lora_expand_ref, lora_loop_ref, lora_shrink_ref  # noqa: E402
from replica.kernels.segments import build_segments  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The interpreter rounds fp32 -> bf16 by truncation, so bf16 results may sit one bf16 ulp from torch's.
TOLERANCE = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
LAUNCHES = ("gathered", "segmented")


def make_slots(pattern: str, num_tokens: int, num_slots: int, gen: torch.Generator) -> torch.Tensor:
    """slot_of_row [num_tokens] int32 for a named mapping of rows to adapters."""
    if pattern == "one_adapter":
        slots = torch.full((num_tokens,), num_slots - 1)
    elif pattern == "all_distinct":
        slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    elif pattern == "all_base":
        slots = torch.full((num_tokens,), -1)
    elif pattern == "with_base_rows":
        slots = torch.randint(0, num_slots, (num_tokens,), generator=gen)
        slots[::3] = -1
    else:  # mixed: a few adapters, interleaved, some rows on the base model
        slots = torch.randint(-1, min(3, num_slots), (num_tokens,), generator=gen)
    return slots.to(torch.int32)


def make_pool(
    num_slots: int, rank: int, hidden_in: int, hidden_out: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random pool: a_stack [num_slots, rank, hidden_in], b_stack [num_slots, hidden_out, rank], scale."""
    a_stack = (torch.randn(num_slots, rank, hidden_in, generator=gen) / hidden_in**0.5).to(dtype)
    b_stack = (torch.randn(num_slots, hidden_out, rank, generator=gen) / rank**0.5).to(dtype)
    scale = torch.rand(num_slots, generator=gen) * 2 + 0.5
    return a_stack, b_stack, scale


def run_case(
    ops: ModuleType,
    launch: str,
    pattern: str,
    dtype: torch.dtype,
    rank: int,
    num_tokens: int,
    hidden_in: int,
    hidden_out: int,
    seed: int = 0,
) -> None:
    """Compare one shrink and one expand launch against the reference, asserting within dtype tolerance."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = max(num_tokens, 4) if pattern == "all_distinct" else 4
    a_stack, b_stack, scale = make_pool(num_slots, rank, hidden_in, hidden_out, dtype, gen)
    slots = make_slots(pattern, num_tokens, num_slots, gen)
    x = torch.randn(num_tokens, hidden_in, generator=gen).to(dtype)  # [num_tokens, hidden_in]
    segments = build_segments(slots) if launch == "segmented" else None

    t = ops.lora_shrink(x, a_stack, slots, segments)  # [num_tokens, rank]
    t_ref = lora_shrink_ref(x, a_stack, slots)
    assert t.dtype == dtype and t.shape == (num_tokens, rank)
    torch.testing.assert_close(t.float(), t_ref.float(), **TOLERANCE[dtype])

    out = torch.randn(num_tokens, hidden_out, generator=gen).to(dtype)  # [num_tokens, hidden_out]
    out_ref = out.clone()
    ops.lora_expand(out, t_ref, b_stack, scale, slots, segments)
    lora_expand_ref(out_ref, t_ref, b_stack, scale, slots)
    torch.testing.assert_close(out.float(), out_ref.float(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", ["one_adapter", "all_distinct", "with_base_rows", "mixed"])
@pytest.mark.parametrize("launch", LAUNCHES)
def test_kernels_match_reference_for_each_slot_mapping(
    triton_ops: ModuleType, launch: str, pattern: str, dtype: torch.dtype
) -> None:
    rank = {"one_adapter": 8, "all_distinct": 16, "with_base_rows": 32, "mixed": 16}[pattern]
    run_case(triton_ops, launch, pattern, dtype, rank, num_tokens=9, hidden_in=96, hidden_out=64)


@pytest.mark.parametrize("rank", [8, 12, 16, 32, 64])
@pytest.mark.parametrize("launch", LAUNCHES)
def test_kernels_match_reference_for_every_rank_bucket(
    triton_ops: ModuleType, launch: str, rank: int
) -> None:
    run_case(
        triton_ops,
        launch,
        "mixed",
        torch.bfloat16,
        rank,
        num_tokens=6,
        hidden_in=64,
        hidden_out=80,
        seed=rank,
    )


@pytest.mark.parametrize("launch", LAUNCHES)
def test_kernels_handle_a_single_row(triton_ops: ModuleType, launch: str) -> None:
    run_case(triton_ops, launch, "one_adapter", torch.float16, 16, num_tokens=1, hidden_in=64, hidden_out=64)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_kernels_handle_sizes_that_are_not_block_multiples(triton_ops: ModuleType, launch: str) -> None:
    # 37 rows on one adapter span several row tiles; 576 and 1536 are SmolLM2's hidden and MLP widths.
    run_case(
        triton_ops, launch, "one_adapter", torch.float32, 16, num_tokens=37, hidden_in=576, hidden_out=1536
    )


@pytest.mark.parametrize("launch", LAUNCHES)
def test_rows_without_adapter_get_zero_t_and_untouched_output(triton_ops: ModuleType, launch: str) -> None:
    gen = torch.Generator().manual_seed(3)
    a_stack, b_stack, scale = make_pool(4, 16, 64, 48, torch.bfloat16, gen)
    slots = torch.tensor([-1, 2, -1, 0, -1], dtype=torch.int32)
    segments = build_segments(slots) if launch == "segmented" else None
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    t = triton_ops.lora_shrink(x, a_stack, slots, segments)
    assert torch.count_nonzero(t[slots < 0]) == 0
    out = torch.randn(5, 48, generator=gen).to(torch.bfloat16)
    before = out.clone()
    triton_ops.lora_expand(out, t, b_stack, scale, slots, segments)
    assert torch.equal(out[slots < 0], before[slots < 0])
    assert not torch.equal(out[slots >= 0], before[slots >= 0])


@pytest.mark.parametrize("launch", LAUNCHES)
def test_all_base_batch_leaves_everything_alone(triton_ops: ModuleType, launch: str) -> None:
    run_case(triton_ops, launch, "all_base", torch.float32, 16, num_tokens=4, hidden_in=32, hidden_out=32)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_shrink_then_expand_equals_the_per_row_loop(triton_ops: ModuleType, launch: str) -> None:
    gen = torch.Generator().manual_seed(5)
    a_stack, b_stack, scale = make_pool(5, 16, 80, 72, torch.float32, gen)
    slots = make_slots("mixed", 11, 5, gen)
    segments = build_segments(slots) if launch == "segmented" else None
    x = torch.randn(11, 80, generator=gen)
    out = torch.zeros(11, 72)
    t = triton_ops.lora_shrink(x, a_stack, slots, segments)
    triton_ops.lora_expand(out, t, b_stack, scale, slots, segments)
    torch.testing.assert_close(out, lora_loop_ref(x, a_stack, b_stack, scale, slots), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_row_strided_views_and_int64_slots_are_accepted(triton_ops: ModuleType, launch: str) -> None:
    gen = torch.Generator().manual_seed(7)
    a_stack, b_stack, scale = make_pool(3, 8, 32, 24, torch.float32, gen)
    slots = torch.tensor([1, 0, 1, 2], dtype=torch.int64)
    segments = build_segments(slots) if launch == "segmented" else None
    fused = torch.randn(4, 32 + 24, generator=gen)  # [num_tokens, hidden_in + hidden_out]: two views of it
    x, out = fused[:, :32], fused[:, 32:]
    x_copy, out_ref = x.clone(), out.clone()
    t = triton_ops.lora_shrink(x, a_stack, slots, segments)
    torch.testing.assert_close(t, lora_shrink_ref(x_copy, a_stack, slots), atol=1e-5, rtol=1e-5)
    triton_ops.lora_expand(out, t, b_stack, scale, slots, segments)
    lora_expand_ref(out_ref, t, b_stack, scale, slots)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(fused[:, :32], x_copy)  # expand wrote only its own columns


@pytest.mark.parametrize("launch", LAUNCHES)
def test_slot_arena_views_with_a_row_stride_are_read_per_slot(triton_ops: ModuleType, launch: str) -> None:
    """Pools that are views into a slot arena (slot stride = the whole row, scale strided) give the
    same result as contiguous copies of them."""
    from replica.lora.arena import build_arenas

    gen = torch.Generator().manual_seed(11)
    arena = build_arenas({(0, "q_proj"): (32, 24), (0, "v_proj"): (40, 16)}, {8: 3}, torch.float32, "cpu")[8]
    arena.data.normal_(generator=gen)
    arena.scales.uniform_(0.5, 2.0, generator=gen)
    slots = torch.tensor([2, 0, -1, 2, 1], dtype=torch.int32)
    segments = build_segments(slots) if launch == "segmented" else None
    for key, fan_in, fan_out in (((0, "q_proj"), 32, 24), ((0, "v_proj"), 40, 16)):
        pool = arena.pool(key)
        assert not pool.a.is_contiguous() and pool.a.stride(0) == arena.data.shape[1]
        x, out = torch.randn(5, fan_in, generator=gen), torch.randn(5, fan_out, generator=gen)
        out_ref = out.clone()
        t = triton_ops.lora_shrink(x, pool.a, slots, segments)
        torch.testing.assert_close(t, lora_shrink_ref(x, pool.a.contiguous(), slots), atol=1e-5, rtol=1e-5)
        triton_ops.lora_expand(out, t, pool.b, pool.scale, slots, segments)
        lora_expand_ref(out_ref, t, pool.b.contiguous(), pool.scale.contiguous(), slots)
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)


def test_empty_batch_returns_empty_t(triton_ops: ModuleType) -> None:
    a_stack = torch.zeros(2, 8, 16)
    slots = torch.zeros(0, dtype=torch.int32)
    assert triton_ops.lora_shrink(torch.zeros(0, 16), a_stack, slots).shape == (0, 8)
    triton_ops.lora_expand(torch.zeros(0, 4), torch.zeros(0, 8), torch.zeros(2, 4, 8), torch.ones(2), slots)


def valid_inputs() -> dict[str, torch.Tensor]:
    """A small consistent set of launcher inputs (fp32, 3 rows, rank 8, 2 slots)."""
    return dict(
        x=torch.randn(3, 16),
        a_stack=torch.randn(2, 8, 16),
        b_stack=torch.randn(2, 12, 8),
        scale=torch.ones(2),
        slots=torch.tensor([0, -1, 1], dtype=torch.int32),
        out=torch.zeros(3, 12),
        t=torch.zeros(3, 8),
    )


SHRINK_ERRORS = {
    "x_not_2d": (dict(x=torch.randn(3, 1, 16)), "x must be 2-D"),
    "hidden_mismatch": (dict(x=torch.randn(3, 20)), "hidden_in 16, x has 20"),
    "dtype_mismatch": (dict(a_stack=torch.randn(2, 8, 16).half()), "must equal x dtype"),
    "int_x": (
        dict(x=torch.ones(3, 16, dtype=torch.int32), a_stack=torch.ones(2, 8, 16, dtype=torch.int32)),
        "float16",
    ),
    "stack_not_contiguous": (
        dict(a_stack=torch.randn(2, 16, 8).transpose(1, 2)),
        "a_stack must have contiguous slots",
    ),
    "x_columns_strided": (dict(x=torch.randn(16, 3).t()), "contiguous in its last dimension"),
    "slots_float": (dict(slots=torch.zeros(3)), "int32 or int64"),
    "slots_wrong_length": (
        dict(slots=torch.zeros(4, dtype=torch.int32)),
        r"slot_of_row must have shape \[3\]",
    ),
    "stack_on_other_device": (dict(a_stack=torch.empty(2, 8, 16, device="meta")), "a_stack is on meta"),
}


@pytest.mark.parametrize("case", list(SHRINK_ERRORS), ids=str)
@pytest.mark.parametrize("launch", LAUNCHES)
def test_shrink_launcher_rejects_bad_inputs(triton_ops: ModuleType, launch: str, case: str) -> None:
    override, message = SHRINK_ERRORS[case]
    args = {**valid_inputs(), **override}
    segments = build_segments(torch.tensor([0, -1, 1])) if launch == "segmented" else None
    with pytest.raises(ValueError, match=message):
        triton_ops.lora_shrink(args["x"], args["a_stack"], args["slots"], segments)


EXPAND_ERRORS = {
    "hidden_mismatch": (dict(out=torch.zeros(3, 10)), "hidden_out 12, out has 10"),
    "t_wrong_rank": (dict(t=torch.zeros(3, 4)), r"t must have shape \[3, 8\]"),
    "t_dtype": (dict(t=torch.zeros(3, 8).half()), "must match out's dtype"),
    "t_not_contiguous": (dict(t=torch.zeros(8, 3).t()), "t must be contiguous"),
    "scale_length": (dict(scale=torch.ones(3)), r"scale must have shape \[2\]"),
    "scale_int": (dict(scale=torch.ones(2, dtype=torch.int64)), "scale must be float16"),
    "b_not_3d": (dict(b_stack=torch.randn(12, 8)), "b_stack must be 3-D"),
    "slots_2d": (dict(slots=torch.zeros(3, 1, dtype=torch.int32)), "slot_of_row must have shape"),
}


@pytest.mark.parametrize("case", list(EXPAND_ERRORS), ids=str)
@pytest.mark.parametrize("launch", LAUNCHES)
def test_expand_launcher_rejects_bad_inputs(triton_ops: ModuleType, launch: str, case: str) -> None:
    override, message = EXPAND_ERRORS[case]
    args = {**valid_inputs(), **override}
    segments = build_segments(torch.tensor([0, -1, 1])) if launch == "segmented" else None
    with pytest.raises(ValueError, match=message):
        triton_ops.lora_expand(
            args["out"], args["t"], args["b_stack"], args["scale"], args["slots"], segments
        )


def test_segmented_launch_rejects_segments_of_another_batch(triton_ops: ModuleType) -> None:
    args = valid_inputs()
    other = build_segments(torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="segments were built for 2 rows"):
        triton_ops.lora_shrink(args["x"], args["a_stack"], args["slots"], other)
    with pytest.raises(ValueError, match="segments were built for 2 rows"):
        triton_ops.lora_expand(args["out"], args["t"], args["b_stack"], args["scale"], args["slots"], other)
