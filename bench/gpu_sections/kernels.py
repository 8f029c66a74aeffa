"""The kernel section: the LoRA shrink/expand launches and paged decode attention against their references."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from bench.gpu_sections.common import Bench
from bench.gpu_sections.modes import SHAPES
from replica.kernels import ops, paged_ops
from replica.kernels.reference import lora_expand_ref, lora_shrink_ref, paged_decode_ref
from replica.kernels.segments import build_segments

log = logging.getLogger("gpu_check")

NUM_SLOTS = 32
TOLERANCE = {torch.bfloat16: (1e-2, 1.6e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-4, 1e-4)}


def check(bench: Bench, out: dict[str, Any]) -> None:
    """Every case through the path the device uses (Triton on CUDA, torch elsewhere); fails if one is off."""
    out["implementation"] = ops.implementation_for(bench.device)
    gen = torch.Generator(device=bench.device).manual_seed(0)
    run_cases(lora_cases(bench), lambda case: check_lora(**case, gen=gen), bench.save, out, "lora")
    run_cases(paged_cases(bench), lambda case: check_paged(**case, gen=gen), bench.save, out, "paged_decode")
    bad = [row for key in ("lora", "paged_decode") for row in out[key] if not row["ok"]]
    if bad:
        raise AssertionError(f"{len(bad)} kernel checks differ from the reference: {bad[:3]}")


def run_cases(
    cases: list[dict[str, Any]],
    fn: Callable[[dict[str, Any]], dict[str, Any]],
    save: Callable[[], None],
    out: dict[str, Any],
    key: str,
) -> None:
    """out[key]: each case's row with ok and its error (a raising case fails its row); saved after each."""
    rows: list[dict[str, Any]] = []
    out[key] = rows
    for case in cases:
        row = {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for k, v in case.items()}
        try:
            row.update(fn(case))
        except Exception as exc:  # one broken case must not hide the others
            log.exception("kernel check %s failed", row)
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        rows.append(row)
        save()


def lora_cases(bench: Bench) -> list[dict[str, Any]]:
    """Every module shape at the mode's ranks, both launches (decode gathers, prefill segments)."""
    shape = SHAPES[bench.mode.shape]
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    shapes = [
        (bench.dtype, k, d, r) for k, d in ((h, h), (h, inter), (inter, h)) for r in bench.mode.kernel_ranks
    ]
    shapes += [(dtype, h, h, 16) for dtype in bench.mode.kernel_dtypes]
    segmented_rows = 160 if bench.mode.shape == "tiny" else 1000
    return [
        dict(dtype=dtype, hidden_in=k, hidden_out=d, rank=r, launch=launch, num_tokens=n)
        for dtype, k, d, r in shapes
        for launch, n in (("gathered", 32), ("segmented", segmented_rows))
    ]


def check_lora(
    dtype: torch.dtype,
    hidden_in: int,
    hidden_out: int,
    rank: int,
    launch: str,
    num_tokens: int,
    gen: torch.Generator,
) -> dict[str, Any]:
    """One shrink and one expand launch against the reference on random data."""
    device, k, d, r, n = gen.device, hidden_in, hidden_out, rank, num_tokens
    a = (torch.randn(NUM_SLOTS, r, k, device=device, generator=gen) * k**-0.5).to(dtype)  # [slots, rank, in]
    b = (torch.randn(NUM_SLOTS, d, r, device=device, generator=gen) * r**-0.5).to(dtype)  # [slots, out, rank]
    scale = torch.rand(NUM_SLOTS, device=device, generator=gen) + 0.5  # [slots]
    if launch == "gathered":  # decode: every row its own adapter, one row on the base model
        slots = torch.randperm(NUM_SLOTS, device=device, generator=gen)[:n].to(torch.int32)
        slots[0] = -1
    else:  # prefill: runs of rows (whole prompts) on a few adapters, some on the base model
        slots = torch.randint(-1, 8, (20,), device=device, generator=gen).repeat_interleave(n // 20)
        slots = slots.to(torch.int32)
    segments = build_segments(slots) if launch == "segmented" else None
    x = torch.randn(n, k, device=device, generator=gen).to(dtype)  # [num_tokens, hidden_in]
    y = torch.randn(n, d, device=device, generator=gen).to(dtype)  # [num_tokens, hidden_out]
    t = ops.lora_shrink(x, a, slots, segments)
    t_ref = lora_shrink_ref(x, a, slots)
    y_ref = y.clone()
    ops.lora_expand(y, t_ref, b, scale, slots, segments)
    lora_expand_ref(y_ref, t_ref, b, scale, slots)
    return compare(dtype, [(t, t_ref), (y, y_ref)])


def paged_cases(bench: Bench) -> list[dict[str, Any]]:
    """Rows of mixed lengths over shuffled blocks: the model's heads, and a grouped-query variant."""
    shape = SHAPES[bench.mode.shape]
    heads, head_dim = shape["num_attention_heads"], shape["hidden_size"] // shape["num_attention_heads"]
    lens = [1, 17, 100, 300] if bench.mode.shape == "tiny" else [1, 17, 300, 1024, 2048]
    return [
        dict(dtype=bench.dtype, heads=heads, kv_heads=kv, head_dim=head_dim, context_lens=lens)
        for kv in sorted({shape["num_key_value_heads"], max(1, heads // 4)}, reverse=True)
    ]


def check_paged(
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    context_lens: list[int],
    gen: torch.Generator,
) -> dict[str, Any]:
    """paged_ops.paged_decode (the model's call) against the per-row reference, on random caches."""
    device, block_size, lens = gen.device, 16, context_lens
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 4
    tables = torch.zeros(len(lens), max(widths), dtype=torch.int32, device=device)  # [rows, max_blocks]
    order = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    first = 0
    for i, w in enumerate(widths):
        tables[i, :w] = order[first : first + w]
        first += w
    cache = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(cache, device=device, generator=gen).to(dtype)
    v_cache = torch.randn(cache, device=device, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, head_dim, device=device, generator=gen).to(dtype)  # [rows, heads, hd]
    lengths = torch.tensor(lens, dtype=torch.int32, device=device)  # [rows]
    scale = head_dim**-0.5
    got = paged_ops.paged_decode(q, k_cache, v_cache, tables, lengths, max(widths), scale)
    want = paged_decode_ref(q, k_cache, v_cache, tables, lengths, scale)
    return compare(dtype, [(got, want)])


def compare(dtype: torch.dtype, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """ok when every pair is close at the dtype's tolerance; the largest absolute difference."""
    atol, rtol = TOLERANCE[dtype]
    floats = [(g.float(), w.float()) for g, w in pairs]
    return dict(
        ok=all(torch.allclose(g, w, atol=atol, rtol=rtol) for g, w in floats),
        max_abs_err=max((g - w).abs().max().item() for g, w in floats),
    )
