"""The slot-row geometry: PEFT tensor-name order, and plans that put a packed buffer's modules exactly where
the row holds them, zeroing every other module (pure: lists stand in for tensors)."""

from __future__ import annotations

import itertools
import random

import pytest

from replica.lora.row_layout import RowLayout, RowPlan, name_order

SHAPES = {
    (layer, name): (3 + layer, 2 + len(name) % 3)
    for layer in (0, 1, 2, 10)
    for name in ("q_proj", "v_proj", "down_proj")
}
ROW = RowLayout.for_modules(2, SHAPES)


def apply(plan: RowPlan, row: list, flat: list, row_scales: list, scales: list) -> None:
    """What slot_copy does, on lists."""
    for dst, src, copies, zeros in (
        (row, flat, plan.copies, plan.zeros),
        (row_scales, scales, plan.scale_copies, plan.scale_zeros),
    ):
        for row_off, buf_off, n in copies:
            dst[row_off : row_off + n] = src[buf_off : buf_off + n]
        for row_off, n in zeros:
            dst[row_off : row_off + n] = [0] * n


def test_the_row_is_in_peft_tensor_name_order() -> None:
    keys = [k for k, _, _ in ROW.modules]
    names = [
        f"base_model.model.model.layers.{i}.{'mlp' if n == 'down_proj' else 'self_attn'}.{n}" for i, n in keys
    ]
    assert names == sorted(names)  # as a safetensors file stores them: layers 0, 1, 10, 2
    assert [k[0] for k in keys[::3]] == [0, 1, 10, 2] and keys == sorted(keys, key=name_order)
    assert ROW.offsets[0] == 0 and ROW.row_numel == sum(2 * (i + o) for i, o in SHAPES.values())


@pytest.mark.parametrize("seed", range(30))
def test_a_plan_writes_the_targets_where_the_row_holds_them_and_zeroes_the_rest(seed: int) -> None:
    rng = random.Random(seed)
    keys = [k for k, _, _ in ROW.modules]
    targets = tuple(k for k in keys if rng.random() < 0.5)
    plan = ROW.plan(targets)
    flat, cursor, want = [], 0, {}
    for n, key in enumerate(targets):
        size = ROW.module_numel(key)
        want[key] = [(n + 1) * 1000 + i for i in range(size)]
        flat += want[key]
        cursor += size
    assert plan.numel == cursor and plan.num_scales == len(targets)
    row, row_scales = [-1] * ROW.row_numel, [-1.0] * len(keys)  # stale contents of an evicted slot
    apply(plan, row, flat, row_scales, [float(n + 1) for n in range(len(targets))])
    for j, key in enumerate(keys):
        span = row[ROW.offsets[j] : ROW.offsets[j + 1]]
        assert span == want.get(key, [0] * len(span))
        assert row_scales[j] == (targets.index(key) + 1 if key in targets else 0)
    # contiguous targets become one run: never more runs than target groups
    groups = sum(1 for targeted, _run in itertools.groupby(keys, key=lambda k: k in targets) if targeted)
    assert len(plan.copies) == groups


def test_every_module_is_one_copy_and_no_zeroing() -> None:
    plan = ROW.plan(tuple(k for k, _, _ in ROW.modules))
    assert plan.copies == ((0, 0, ROW.row_numel),) and plan.zeros == ()
    assert plan.scale_copies == ((0, 0, len(ROW.modules)),) and plan.scale_zeros == ()


def test_targets_out_of_row_order_or_unknown_are_refused() -> None:
    keys = [k for k, _, _ in ROW.modules]
    with pytest.raises(ValueError, match="row's module order"):
        ROW.plan((keys[2], keys[1]))
    with pytest.raises(ValueError):
        ROW.plan((keys[1], keys[1]))
    with pytest.raises(KeyError):
        ROW.plan(((99, "q_proj"),))
