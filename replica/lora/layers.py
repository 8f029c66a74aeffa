"""LoraLinear: a base nn.Linear plus per-bucket slot pools, views into the slot arenas GpuTier writes."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from replica.forward_context import get_context
from replica.kernels import ops
from replica.kernels.gathered import GatheredRows
from replica.lora.pools import BucketPool


class LoraLinear(nn.Module):
    """y = x W^T (once for the batch) + per row scale[s] * B[s] (A[s] x), s = the row's slot in its bucket."""

    def __init__(self, base: nn.Linear, pools: dict[int, BucketPool]) -> None:
        """pools: rank bucket -> this layer's views into the shared slot arenas (replica.lora.replace)."""
        super().__init__()
        self.base = base
        w = base.weight  # [out_features, in_features]
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.pools = dict(sorted(pools.items()))
        self._table: Any = None  # the pools as one kernel's bucket table, built at the first one-launch step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [num_tokens, in_features] -> y [num_tokens, out_features]
        y = self.base(x)
        self.add_delta(x, y)
        return y

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add each row's adapter term into y in place (y may be its slice of a fused output)."""
        # x [num_tokens, in_features]; y [num_tokens, out_features], last dimension contiguous
        ctx = get_context()
        meta = ctx.lora if ctx is not None else None
        if meta is None:  # no row of the batch has an adapter: no adapter kernel runs
            return
        one_launch = ops.one_launch_for(x.device) if meta.rows is not None else None
        if one_launch is not None and meta.rows is not None:  # every bucket in one shrink and one expand
            if self._table is None:  # the pools are views that never move: built once
                self._table = one_launch[0]([(r, p.a, p.b, p.scale) for r, p in self.pools.items()])
            t = one_launch[1](x, self._table, *meta.rows)  # [num_tokens, largest rank]
            one_launch[2](y, t, self._table, *meta.rows)
            return
        for bucket, slot_of_row in meta.slot_of_row.items():  # a loop over the few rank buckets, not adapters
            pool = self.pools[bucket]
            layout = meta.layouts.get(bucket)
            if isinstance(layout, GatheredRows):  # rows read their own slots: a layer's are gathered at once
                pool.arena.layer_gather().add_term(layout, pool.key, x, y)
                continue
            t = ops.lora_shrink(x, pool.a, slot_of_row, layout)  # [num_tokens, bucket]
            ops.lora_expand(y, t, pool.b, pool.scale, slot_of_row, layout)
