"""Paged decode attention: the Triton kernel (interpreted on CPU) and the torch path against the reference,
and the cache write and prefill gather against a contiguous copy."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton; conftest.py sets it too

import pytest  # noqa: E402
import torch  # noqa: E402

from replica.kernels.paged_ops import gather_context, paged_decode_torch, write_kv  # noqa: E402
from replica.kernels.reference import paged_decode_ref  # noqa: E402

TOLERANCE = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
# (heads, kv_heads, head_dim): plain multi-head, SmolLM2's GQA group of 3 (not a power of two), a head
# size that is not a power of two
SHAPES = [(4, 4, 16), (9, 3, 64), (8, 2, 24)]


def make_case(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, lens: list[int], block_size: int = 4
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(7)
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * max_blocks + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    # every row gets blocks scattered over the cache; padding entries point at block 0 and are never read
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens):
        need = -(-n // block_size)
        tables[i, :need] = order[used : used + need]
        used += need
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES)
def test_triton_kernel_equals_the_reference(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    from replica.kernels.paged_attention import paged_decode

    lens = [1, 4, 5, 13, 16, 0]  # one token, a full block, a block and one, several blocks, an empty row
    q, k, v, tables, ctx = make_case(heads, kv_heads, head_dim, dtype, lens)
    want = paged_decode_ref(q, k, v, tables, ctx, head_dim**-0.5)
    got = paged_decode(q, k, v, tables, ctx, head_dim**-0.5)
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype])
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # the empty row


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES)
def test_torch_path_equals_the_reference(heads: int, kv_heads: int, head_dim: int) -> None:
    lens = [3, 9, 1, 12]
    q, k, v, tables, ctx = make_case(heads, kv_heads, head_dim, torch.float32, lens)
    want = paged_decode_ref(q, k, v, tables, ctx, 0.3)
    got = paged_decode_torch(q, k, v, tables, ctx, max_blocks=3, scale=0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_row_reads_nothing_past_its_length() -> None:
    q, k, v, tables, ctx = make_case(4, 2, 8, torch.float32, [5, 8])
    before = paged_decode_torch(q, k, v, tables, ctx, max_blocks=2, scale=1.0)
    # poison every position past row 0's length in its blocks, and every block it does not own
    k2, v2 = k.clone(), v.clone()
    own = tables[0, :2].long()
    mask = torch.ones(k.shape[0], dtype=torch.bool)
    mask[own] = False
    k2[mask], v2[mask] = float("nan"), float("nan")
    k2[own[1], 1:], v2[own[1], 1:] = 1e6, 1e6  # positions 5..7
    after = paged_decode_torch(q[:1], k2, v2, tables[:1], ctx[:1], max_blocks=2, scale=1.0)
    torch.testing.assert_close(after, before[:1])


def test_write_then_gather_gives_back_the_sequence() -> None:
    block_size, kv_heads, head_dim = 4, 2, 8
    k_cache = torch.zeros(6, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    blocks = torch.tensor([4, 1, 3])
    k, v = torch.randn(10, kv_heads, head_dim), torch.randn(10, kv_heads, head_dim)
    slots = torch.tensor([int(blocks[i // block_size]) * block_size + i % block_size for i in range(10)])
    write_kv(k_cache, v_cache, slots, k, v)
    assert torch.equal(gather_context(k_cache, blocks, 10), k)
    assert torch.equal(gather_context(v_cache, blocks, 7), v[:7])
    assert torch.count_nonzero(k_cache[[0, 2, 5]]) == 0
