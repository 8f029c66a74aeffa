"""LoraLinear: a base nn.Linear plus per-bucket slot pools, with a small slot API (set_slot, reset_slot)."""

from __future__ import annotations

import torch
from torch import nn

from replica.engine.context import get_context
from replica.kernels import ops
from replica.lora.arena import build_arenas
from replica.lora.pools import BucketPool

_ALONE = (-1, "linear")  # the module key of a layer that owns its arenas


class LoraLinear(nn.Module):
    """y = x W^T (once for the batch) + per row scale[s] * B[s] (A[s] x), s = the row's slot in its bucket."""

    def __init__(
        self, base: nn.Linear, capacities: dict[int, int], pools: dict[int, BucketPool] | None = None
    ) -> None:
        """pools: this layer's views into shared slot arenas (replica.lora.replace.lora_layers); without
        them the layer gets arenas of its own."""
        super().__init__()
        self.base = base
        w = base.weight  # [out_features, in_features]
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        if pools is None:
            arenas = build_arenas(
                {_ALONE: (self.in_features, self.out_features)}, capacities, w.dtype, w.device
            )
            pools = {rank: arena.pool(_ALONE) for rank, arena in arenas.items()}
        if sorted(pools) != sorted(capacities):
            raise ValueError(f"pools for ranks {sorted(pools)}, capacities for {sorted(capacities)}")
        self.pools = dict(sorted(pools.items()))

    def set_slot(self, bucket: int, index: int, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
        """Write an adapter's A [r, in_features] and B [out_features, r] into a slot of a bucket."""
        self.pools[bucket].write(index, a, b, scale)

    def reset_slot(self, bucket: int, index: int) -> None:
        """Make the slot contribute nothing (free slot, or the adapter does not target this module)."""
        self.pools[bucket].reset(index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [num_tokens, in_features] -> y [num_tokens, out_features]
        y = self.base(x)
        ctx = get_context()
        meta = ctx.lora if ctx is not None else None
        if meta is None:
            return y
        for bucket, slot_of_row in meta.slot_of_row.items():  # a loop over the few rank buckets, not adapters
            pool = self.pools[bucket]
            layout = meta.layouts.get(bucket)
            t = ops.lora_shrink(x, pool.a, slot_of_row, layout)  # [num_tokens, bucket]
            ops.lora_expand(y, t, pool.b, pool.scale, slot_of_row, layout)
        return y
