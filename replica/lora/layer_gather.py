"""The gathered adapter path's memory: each row's slot of a whole layer, or of one module, copied at once.

A slot row keeps each layer's modules side by side (replica.lora.row_layout), so every row's share of a
layer is one span of its arena row, and each module's A and B are one span within it. Per forward pass the
gather copies the rows' scales once, then each layer's span once (or, where the layer's copy for every row
would pass WHOLE_LAYER_BYTES, each module's span as the module comes), into buffers that never move; each
projection's A and B are views of them, built once per row count and kept. A projection then costs the
few operators of kernels.gathered.gathered_term, in place of an index_select for each of A, B and scale.

The buffers grow to the largest copy seen and are shared by the layers: a copy overwrites the last, which
the forward pass has finished with. In half precision they hold fp32 copies, as the reference accumulates
in fp32. Not thread-safe: one forward pass at a time uses an arena (the engine thread runs every one).
"""

from __future__ import annotations

import torch

from replica.kernels.gathered import GatheredRows, gathered_term
from replica.lora.row_layout import ModuleKey, RowLayout

# A layer whose copy for every row is larger is copied a module at a time: a copy much larger than the
# cache is written out to memory and read back. (SmolLM2's layer at rank 16 and 32 rows is 21 MB; copied
# whole, it made the 32-adapter decode 20% slower: `lorafleet bench engine-ab`.) The canary's is 1.7 MB.
WHOLE_LAYER_BYTES = 4 << 20
_MAX_VIEWS = 4096  # cached (rows, module) views; past it the cache starts over

Views = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # A^T [n, in, r], B^T [n, r, out], scale [n, 1, 1]


class LayerGather:
    """One rank bucket's arena, gathered a layer (or a module) at a time for the pass under way's rows."""

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
        # key -> (its span in the row, in_features, out_features, scale column)
        self.where: dict[ModuleKey, tuple[tuple[int, int], int, int, int]] = {
            key: ((layout.offsets[j], layout.offsets[j + 1]), fan_in, fan_out, j)
            for j, (key, fan_in, fan_out) in enumerate(layout.modules)
        }
        self.dtype = torch.float32  # the copies' (fp32 stays fp32; half types are widened)
        self.buf = torch.empty(0, dtype=self.dtype, device=data.device)  # the rows' copied span, flat
        self.sbuf = torch.empty(0, dtype=torch.float32, device=data.device)  # their scales, flat
        self.views: dict[tuple[int, ModuleKey], Views] = {}
        self._rows: GatheredRows | None = None  # whose scales sbuf holds
        self._held: tuple[int, int] | None = None  # the row span buf holds, for _rows

    def add_term(self, rows: GatheredRows, key: ModuleKey, x: torch.Tensor, out: torch.Tensor) -> None:
        """out[i] += scale * B @ (A @ x[i]) of row i's slot, for the module key (out may be a slice)."""
        a_t, b_t, scale = self._views(rows, key, x.shape[0])
        gathered_term(x, out, a_t, b_t, scale, rows.empty)

    def _span(self, key: ModuleKey, n: int) -> tuple[int, int]:
        """The row span copied for key: its layer's, or its own where the layer's would be too large."""
        lo, hi = self.spans[key[0]]
        if n * (hi - lo) * self.buf.element_size() <= WHOLE_LAYER_BYTES:
            return lo, hi
        return self.where[key][0]

    def _views(self, rows: GatheredRows, key: ModuleKey, n: int) -> Views:
        modules = self.scales.shape[1]
        if rows is not self._rows:  # a new forward pass: its rows' scales, zero for rows without a slot
            if self.sbuf.numel() < n * modules:
                self.sbuf, self.views = (
                    torch.empty(n * modules, dtype=torch.float32, device=self.data.device),
                    {},
                )
            scales = self.sbuf[: n * modules].view(n, modules)
            torch.index_select(self.scales, 0, rows.safe, out=scales)
            scales.mul_(rows.keep)
            self._rows, self._held = rows, None
        lo, hi = self._span(key, n)
        if (lo, hi) != self._held:
            if self.buf.numel() < n * (hi - lo):
                self.buf, self.views = (
                    torch.empty(n * (hi - lo), dtype=self.dtype, device=self.data.device),
                    {},
                )
            span = self.buf[: n * (hi - lo)].view(n, hi - lo)
            if self.data.dtype == self.dtype:
                torch.index_select(self.data[:, lo:hi], 0, rows.safe, out=span)
            else:
                span.copy_(self.data[:, lo:hi].index_select(0, rows.safe))
            self._held = lo, hi
        views = self.views.get((n, key))
        if views is None:
            views = self._build_views(n, key, lo, hi)
        return views

    def _build_views(self, n: int, key: ModuleKey, lo: int, hi: int) -> Views:
        (start, _end), fan_in, fan_out, j = self.where[key]
        start, r = start - lo, self.rank
        span = self.buf[: n * (hi - lo)].view(n, hi - lo)
        a_t = span[:, start : start + r * fan_in].view(n, r, fan_in).transpose(1, 2)
        b_t = span[:, start + r * fan_in : start + r * (fan_in + fan_out)].view(n, fan_out, r).transpose(1, 2)
        scale = self.sbuf[: n * self.scales.shape[1]].view(n, -1)[:, j, None, None]
        if len(self.views) >= _MAX_VIEWS:
            self.views.clear()
        self.views[(n, key)] = (a_t, b_t, scale)
        return a_t, b_t, scale
