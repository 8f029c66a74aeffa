"""Slot arenas: the slot pools of every adapted linear, for one rank bucket, as views into one tensor.

Row s of an arena holds slot s of every module in a RowLayout (replica.lora.row_layout); the scales of
slot s sit in row s of a [num_slots, num_modules] fp32 tensor. A pool's a, b and scale are strided views
(the slot stride is the row), each slot's A and B contiguous, so the kernels take the slot stride and
index them as before. A RAM-tier entry packed in the row layout is copied into a slot as a few contiguous
runs (one when the adapter adapts every module at the bucket's rank) instead of one copy per tensor.
"""

from __future__ import annotations

import torch

from replica.lora.layer_gather import LayerGather
from replica.lora.pools import BucketPool
from replica.lora.row_layout import ModuleKey, RowLayout


class SlotArena:
    """One rank bucket: data [num_slots, row_numel] and scales [num_slots, num_modules] fp32, zero-filled."""

    def __init__(self, layout: RowLayout, num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layout = layout
        self.data = torch.zeros(num_slots, layout.row_numel, dtype=dtype, device=device)
        self.scales = torch.zeros(num_slots, len(layout.modules), dtype=torch.float32, device=device)
        self._gather: LayerGather | None = None

    def layer_gather(self) -> LayerGather:
        """The gathered adapter path's buffers for this arena, built at first use."""
        if self._gather is None:
            self._gather = LayerGather(self.layout, self.data, self.scales)
        return self._gather

    @property
    def num_slots(self) -> int:
        return self.data.shape[0]

    def pool(self, key: ModuleKey) -> BucketPool:
        """The module's pool: a [S, rank, in], b [S, out, rank], scale [S], all views into this arena."""
        j = self.layout.index[key]
        _key, fan_in, fan_out = self.layout.modules[j]
        r, s, start = self.layout.rank, self.num_slots, self.layout.offsets[j]
        a = self.data[:, start : start + r * fan_in].view(s, r, fan_in)
        b = self.data[:, start + r * fan_in : start + r * (fan_in + fan_out)].view(s, fan_out, r)
        return BucketPool(r, a, b, self.scales[:, j], self, key)


def build_arenas(
    shapes: dict[ModuleKey, tuple[int, int]],
    capacities: dict[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> dict[int, SlotArena]:
    """One arena per rank bucket over the given modules (key -> (in_features, out_features))."""
    return {
        rank: SlotArena(RowLayout.for_modules(rank, shapes), slots, dtype, device)
        for rank, slots in sorted(capacities.items())
    }
