"""One launch over every rank bucket equals running each bucket's reference (Triton interpreted on CPU)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton; conftest.py sets it too

import pytest  # noqa: E402
import torch  # noqa: E402

from replica.kernels.reference import lora_expand_ref, lora_shrink_ref  # noqa: E402

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _stacks(gen: torch.Generator, dtype: torch.dtype, k: int, d: int) -> list[tuple[int, ...]]:
    """Three buckets of different ranks and slot counts, each a strided view of its own arena."""
    out = []
    for bucket, slots in ((8, 3), (16, 4), (64, 2)):
        arena = torch.randn(slots, bucket * (k + d) + 5, generator=gen).to(dtype)  # padded rows: strided
        a = arena[:, : bucket * k].view(slots, bucket, k)
        b = arena[:, bucket * k : bucket * (k + d)].view(slots, d, bucket)
        scales = torch.rand(slots, 3, generator=gen) + 0.5  # one column per module, as arenas keep them
        out.append((bucket, a, b, scales[:, 1]))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_one_launch_over_every_bucket_equals_each_bucket_on_its_own(dtype: torch.dtype) -> None:
    from replica.kernels.lora_multi import bucket_table, expand_multi, shrink_multi

    gen = torch.Generator().manual_seed(0)
    k, d = 40, 24
    stacks = _stacks(gen, dtype, k, d)
    table = bucket_table(stacks)
    buckets = torch.tensor([16, 0, 8, 64, 16, 8, 0, 64, 32], dtype=torch.int32)  # 32: a bucket it lacks
    slots = torch.tensor([3, 0, 2, 1, 0, 0, 5, 0, 1], dtype=torch.int32)
    x = torch.randn(9, k, generator=gen).to(dtype)
    wide = torch.randn(9, d + 7, generator=gen).to(dtype)
    out = wide[:, 3 : 3 + d]  # a slice of a fused output
    expected = out.clone()
    t = shrink_multi(x, table, buckets, slots)
    assert t.shape == (9, 64)
    for bucket, a, b, scale in stacks:
        rows = torch.where(buckets == bucket, slots, torch.full_like(slots, -1))
        t_ref = lora_shrink_ref(x, a, rows)
        mine = t[:, :bucket][buckets == bucket]
        torch.testing.assert_close(
            mine.float(), t_ref[buckets == bucket].float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
        )
        assert torch.all(t[buckets == bucket, bucket:] == 0)
        lora_expand_ref(expected, t_ref, b, scale, rows)
    assert torch.all(t[(buckets == 0) | (buckets == 32)] == 0)
    before = wide.clone()
    expand_multi(out, t, table, buckets, slots)
    tol = TOLERANCE[dtype] * 4
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    assert torch.equal(wide[:, :3], before[:, :3]) and torch.equal(wide[:, 3 + d :], before[:, 3 + d :])
    for row in (1, 6, 8):  # no adapter, or a bucket the table lacks: untouched
        assert torch.equal(out[row], before[row, 3 : 3 + d])


def test_the_table_refuses_stacks_that_do_not_fit_together() -> None:
    from replica.kernels.lora_multi import bucket_table

    gen = torch.Generator().manual_seed(1)
    stacks = _stacks(gen, torch.float32, 16, 8)
    bad = [stacks[0], (32, stacks[1][1].to(torch.float16), stacks[1][2], stacks[1][3])]
    with pytest.raises(ValueError, match="one dtype"):
        bucket_table(bad)
    with pytest.raises(ValueError, match="at least one"):
        bucket_table([])
