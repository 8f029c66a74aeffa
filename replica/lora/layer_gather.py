"""The gathered adapter path's memory: each row's slot of one whole layer, copied in one operator.

A slot row keeps each layer's modules side by side (replica.lora.row_layout), so every row's share of a
layer is one span of its arena row. Per forward pass the gather copies the rows' scales once, and each
layer's span once, into buffers that never move; each projection's A and B are views of them, built once per
row count and kept. A projection then costs the three operators of kernels.gathered.gathered_term, in place
of an index_select for each of A, B and scale.

The buffers are sized by the most rows seen and by the widest layer span, and shared by the layers: a
layer's gather overwrites the last, which the forward pass has finished with. In half precision they hold
fp32 copies, as the reference accumulates in fp32.
"""

from __future__ import annotations

import torch

from replica.kernels.gathered import GatheredRows, gathered_term
from replica.lora.row_layout import ModuleKey, RowLayout

_MAX_VIEWS = 4096  # cached (rows, module) views; past it the cache starts over


class LayerGather:
    """One rank bucket's arena, gathered a layer at a time for the rows of the forward pass in progress."""

    def __init__(self, layout: RowLayout, data: torch.Tensor, scales: torch.Tensor) -> None:
        # data [num_slots, row_numel] and scales [num_slots, num_modules]: the arena's own tensors
        self.data, self.scales, self.rank = data, scales, layout.rank
        spans: dict[int, tuple[int, int]] = {}
        for j, ((layer, _name), _in, _out) in enumerate(layout.modules):
            lo, hi = spans.get(layer, (layout.offsets[j], layout.offsets[j]))
            if hi != layout.offsets[j]:
                raise ValueError(f"layer {layer}'s modules are not side by side in the slot row")
            spans[layer] = (lo, layout.offsets[j + 1])
        self.spans = spans
        # key -> (layer, offset of A from the layer's start, in_features, out_features, scale column)
        self.where: dict[ModuleKey, tuple[int, int, int, int, int]] = {
            key: (key[0], layout.offsets[j] - spans[key[0]][0], fan_in, fan_out, j)
            for j, (key, fan_in, fan_out) in enumerate(layout.modules)
        }
        self.dtype = data.dtype if data.dtype == torch.float32 else torch.float32
        self.capacity = 0
        self.buf = torch.empty(0, dtype=self.dtype, device=data.device)  # [capacity * widest span]
        self.sbuf = torch.empty(0, dtype=torch.float32, device=data.device)  # [capacity * num_modules]
        self.views: dict[tuple[int, ModuleKey], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._rows: GatheredRows | None = None  # whose scales sbuf holds
        self._layer: int | None = None  # whose span buf holds, for _rows

    def add_term(self, rows: GatheredRows, key: ModuleKey, x: torch.Tensor, out: torch.Tensor) -> None:
        """out[i] += scale * B @ (A @ x[i]) of row i's slot, for the module key (out may be a slice)."""
        a_t, b_t, scale = self._views(rows, key, x.shape[0])
        gathered_term(x, out, a_t, b_t, scale)

    def _views(
        self, rows: GatheredRows, key: ModuleKey, n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if rows is not self._rows:  # a new forward pass: its rows' scales, zero for rows without a slot
            if n > self.capacity:
                self._grow(n)
            scales = self.sbuf[: n * self.scales.shape[1]].view(n, -1)
            torch.index_select(self.scales, 0, rows.safe, out=scales)
            scales.mul_(rows.keep)
            self._rows, self._layer = rows, None
        layer = self.where[key][0]
        if layer != self._layer:
            lo, hi = self.spans[layer]
            span = self.buf[: n * (hi - lo)].view(n, hi - lo)
            if self.data.dtype == self.dtype:
                torch.index_select(self.data[:, lo:hi], 0, rows.safe, out=span)
            else:
                span.copy_(self.data[:, lo:hi].index_select(0, rows.safe))
            self._layer = layer
        views = self.views.get((n, key))
        if views is None:
            views = self._build_views(n, key)
        return views

    def _build_views(self, n: int, key: ModuleKey) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer, start, fan_in, fan_out, j = self.where[key]
        lo, hi = self.spans[layer]
        r = self.rank
        span = self.buf[: n * (hi - lo)].view(n, hi - lo)
        a_t = span[:, start : start + r * fan_in].view(n, r, fan_in).transpose(1, 2)  # [n, in, r]
        b_t = span[:, start + r * fan_in : start + r * (fan_in + fan_out)].view(n, fan_out, r).transpose(1, 2)
        scale = self.sbuf[: n * self.scales.shape[1]].view(n, -1)[:, j, None, None]  # [n, 1, 1]
        if len(self.views) >= _MAX_VIEWS:
            self.views.clear()
        self.views[(n, key)] = (a_t, b_t, scale)
        return a_t, b_t, scale

    def _grow(self, n: int) -> None:
        widest = max(hi - lo for lo, hi in self.spans.values())
        dev = self.data.device
        self.buf = torch.empty(n * widest, dtype=self.dtype, device=dev)
        self.sbuf = torch.empty(n * self.scales.shape[1], dtype=torch.float32, device=dev)
        self.capacity, self.views = n, {}
