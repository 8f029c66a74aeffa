"""Fused projections: q/k/v and gate/up each become one GEMM over their weights stacked at load.

fuse_projections swaps them in (the model file builds the plain Hugging Face modules); the loader does it on
the meta device, before any memory exists, and checkpoints still load by name into the parts' views. Each
original projection keeps its name and its weight, which becomes a view of its rows of the fused weight:
code that works by module name (an adapter merged into the base, the LoRA wrappers' shapes) reads and edits
the same memory, and the parameters are counted once.
A state_dict holds the fused tensors (qkv_proj, gate_up_proj), not the per-name ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinear(nn.Module):
    """y = x W^T for W the parts' weights stacked on the output dimension; returns each part's slice.

    A part that has a term of its own to add (a LoRA wrapper: `add_delta(x, out)`) adds it into its slice
    of the fused output in place, so one base GEMM serves every part.
    """

    def __init__(self, parts: Sequence[nn.Linear]) -> None:
        super().__init__()
        weights = [p.weight for p in parts]  # each [out_features_i, in_features]
        biases = [p.bias for p in parts]
        self.weight = nn.Parameter(torch.cat(weights).detach(), requires_grad=False)  # [sum out, in]
        has_bias = [b is not None for b in biases]
        if any(has_bias) and not all(has_bias):
            raise ValueError("fused projections must all have a bias or all have none")
        bias = torch.cat([b for b in biases if b is not None]).detach() if all(has_bias) else None
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.sizes = [w.shape[0] for w in weights]
        for part in parts:  # re-pointed below as plain views: the memory is the fused weight's
            del part.weight
            if self.bias is not None:
                del part.bias
        self._parts: list[nn.Linear] = list(parts)  # a plain list: they stay registered where they are
        self.point_parts()

    def point_parts(self) -> None:
        """Make each part's weight (and bias) its rows of the fused ones."""
        first = 0
        for part, size in zip(self._parts, self.sizes, strict=True):
            part.weight = self.weight.data[first : first + size]
            if self.bias is not None:
                part.bias = self.bias.data[first : first + size]  # type: ignore[assignment]
            first += size

    def _apply(self, fn: Any, recurse: bool = True) -> FusedLinear:
        """After .to(), .half() and the like move the fused weight, the parts' views follow it."""
        super()._apply(fn, recurse)
        self.point_parts()
        return self

    def forward(self, x: torch.Tensor, parts: Sequence[nn.Module]) -> torch.Tensor:
        # x [num_tokens, in_features] -> y [num_tokens, sum out]: the parts' outputs side by side, in order
        y = F.linear(x, self.weight, self.bias)
        for part, out in zip(parts, y.split(self.sizes, dim=-1), strict=True):
            add_delta = getattr(part, "add_delta", None)
            if add_delta is not None:
                add_delta(x, out)
        return y


def fuse_projections(model: nn.Module) -> None:
    """Give every decoder layer a fused q/k/v and gate/up (a later .to() keeps them joined)."""
    for layer in model.model.layers:  # type: ignore[union-attr]
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv_proj is None:
            attn.qkv_proj = FusedLinear([_base(attn.q_proj), _base(attn.k_proj), _base(attn.v_proj)])
        if mlp.gate_up_proj is None:
            mlp.gate_up_proj = FusedLinear([_base(mlp.gate_proj), _base(mlp.up_proj)])


def _base(module: nn.Module) -> nn.Linear:
    """The plain linear of a projection, under a wrapper if one was swapped in."""
    base = getattr(module, "base", module)
    assert isinstance(base, nn.Linear)
    return base
