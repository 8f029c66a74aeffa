"""The gathered adapter path (a layer of slots copied at once) equals the per-row loop: into a slice of a
fused output, across layers and back, for a new pass's rows and scales, a layer or a module copied at a
time, in fp32 and bf16; and a row without an adapter gets nothing from the slot it stands in on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from replica.forward_context import Context, set_context
from replica.kernels.gathered import build_gathered
from replica.kernels.reference import lora_loop_ref
from replica.lora import layer_gather
from replica.lora.batch_meta import LoraBatchMeta
from replica.lora.layers import LoraLinear
from replica.lora.replace import lora_layers

SHAPES = {
    (0, "q_proj"): (32, 24),
    (0, "k_proj"): (32, 8),
    (1, "q_proj"): (32, 24),
    (1, "down_proj"): (16, 32),
}
RANK, SLOTS = 8, 6


def _layers(dtype: torch.dtype, gen: torch.Generator) -> dict[tuple[int, str], LoraLinear]:
    bases = {
        key: nn.Linear(fan_in, fan_out, bias=False).to(dtype) for key, (fan_in, fan_out) in SHAPES.items()
    }
    layers = lora_layers(bases, {RANK: SLOTS})
    with torch.no_grad():
        for layer in layers.values():
            pool = layer.pools[RANK]
            pool.a.copy_(torch.randn(pool.a.shape, generator=gen))
            pool.b.copy_(torch.randn(pool.b.shape, generator=gen))
            pool.scale.copy_(torch.rand(SLOTS, generator=gen) + 0.5)
    return layers


def _pass(slots: list[int]) -> LoraBatchMeta:
    s = torch.tensor(slots, dtype=torch.int32)
    return LoraBatchMeta({RANK: s}, {RANK: build_gathered(s)})


def _context(meta: LoraBatchMeta) -> Context:
    n = meta.slot_of_row[RANK].shape[0]
    empty = torch.zeros(0, dtype=torch.long)
    return Context(empty, [], torch.arange(n), torch.zeros(n, 0, dtype=torch.int32), empty, 0, lora=meta)


@pytest.mark.parametrize("whole_layer", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_gets_its_own_slot_in_every_layer_and_pass(
    dtype: torch.dtype, whole_layer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not whole_layer:  # every layer too large to copy whole: each module is copied as it comes
        monkeypatch.setattr(layer_gather, "WHOLE_LAYER_BYTES", 0)
    gen = torch.Generator().manual_seed(3)
    layers = _layers(dtype, gen)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    order = [(0, "q_proj"), (0, "k_proj"), (1, "q_proj"), (1, "down_proj"), (0, "q_proj")]  # and back
    passes = [[5, -1, 0, 3, 2], [1, 4, 2, -1, 0, 3, 5], [2]]  # then more rows (the buffers grow), then one
    for slots in passes:
        meta = _pass(slots)
        set_context(_context(meta))
        try:
            for key in order:
                layer, pool = layers[key], layers[key].pools[RANK]
                x = torch.randn(len(slots), layer.in_features, generator=gen).to(dtype)
                wide = torch.randn(len(slots), 3 * layer.out_features, generator=gen).to(dtype)
                before = wide.clone()
                d = layer.out_features
                layer.add_delta(x, wide[:, d : 2 * d])  # the middle of a fused output
                want = before[:, d : 2 * d].float() + lora_loop_ref(
                    x, pool.a, pool.b, pool.scale, meta.slot_of_row[RANK]
                )
                torch.testing.assert_close(wide[:, d : 2 * d].float(), want, atol=tol, rtol=tol)
                assert torch.equal(wide[:, :d], before[:, :d]) and torch.equal(
                    wide[:, 2 * d :], before[:, 2 * d :]
                )
                for i, s in enumerate(slots):
                    assert (s < 0) == torch.equal(wide[i], before[i]), (key, i)  # base rows untouched
        finally:
            set_context(None)


def test_a_row_without_an_adapter_reads_only_its_batch_slots_and_gets_nothing() -> None:
    """Its stand-in slot is one a row of the batch holds (pinned, never mid-write), and another tenant's
    A overflowing on its input cannot reach it."""
    gen = torch.Generator().manual_seed(4)
    layer = _layers(torch.float32, gen)[(1, "down_proj")]
    rows = build_gathered(torch.tensor([-1, 4, -1, 2], dtype=torch.int32))
    assert rows.safe.tolist() == [4, 4, 4, 2] and rows.empty.view(-1).tolist() == [True, False, True, False]
    with torch.no_grad():
        layer.pools[RANK].a[4].fill_(3e38)  # finite weights whose products overflow
    meta = _pass([-1, 4, -1, 2])
    x = torch.full((4, layer.in_features), 2.0)
    out = torch.zeros(4, layer.out_features)
    set_context(_context(meta))
    try:
        layer.add_delta(x, out)
    finally:
        set_context(None)
    assert torch.equal(out[0], torch.zeros(layer.out_features)) and torch.equal(out[2], out[0])
    assert torch.isfinite(out[3]).all() and (out[3] != 0).any()
