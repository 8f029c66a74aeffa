"""Training-time LoRA on a Hugging Face Llama, in plain torch: one wrapper per base linear holds the A and B
of every adapter that trains at once (one adapter is the case of a stack of one).

A batch is laid out [num_adapters * rows_per_adapter, seq, hidden], adapter n owning a contiguous block of
rows, so the adapter path is two batched matmuls and never a loop over adapters. Mixed ranks share one stack
padded to the largest rank; a per-adapter mask keeps the padding at zero and gradient-free, so adapter n
trains exactly its own rank. This is for training only: serving uses replica.lora's slot pools.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lorafleet.peft_format import ModuleTensors
from schemas.llama import LLAMA_MODULES


class LoraLinear(nn.Module):
    """y = x W^T + scale[n] * (x A[n]^T) B[n]^T for the rows of adapter n; W is frozen."""

    mask: torch.Tensor  # buffer [num_adapters, max_rank]
    scale: torch.Tensor  # buffer [num_adapters]

    def __init__(
        self, base: nn.Linear, ranks: list[int], alphas: list[float], generators: list[torch.Generator]
    ) -> None:
        super().__init__()
        self.base = base
        out_features, in_features = base.weight.shape
        num_adapters, max_rank = len(ranks), max(ranks)
        dtype, device = base.weight.dtype, base.weight.device
        bound = 1.0 / math.sqrt(in_features)  # PEFT's kaiming_uniform(a=sqrt(5)) init of lora_A
        a = torch.empty(num_adapters, max_rank, in_features, dtype=dtype)
        for n, gen in enumerate(generators):
            a[n].uniform_(-bound, bound, generator=gen)
        mask = torch.zeros(num_adapters, max_rank, dtype=dtype)
        for n, r in enumerate(ranks):
            mask[n, :r] = 1.0
        self.a = nn.Parameter((a * mask[:, :, None]).to(device))  # [num_adapters, max_rank, in_features]
        # B starts at zero, as in PEFT: every adapter begins as the unchanged base
        self.b = nn.Parameter(torch.zeros(num_adapters, out_features, max_rank, dtype=dtype, device=device))
        self.register_buffer("mask", mask.to(device))  # [num_adapters, max_rank]
        scale = [alpha / r for alpha, r in zip(alphas, ranks, strict=True)]
        self.register_buffer("scale", torch.tensor(scale, dtype=dtype, device=device))  # [num_adapters]
        self.ranks = list(ranks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [num_adapters * rows, seq, in_features] -> y [num_adapters * rows, seq, out_features]
        y = self.base(x)
        n = self.a.shape[0]
        xs = x.reshape(n, -1, x.shape[-1])  # [num_adapters, rows * seq, in_features]
        a = self.a * self.mask[:, :, None]  # [num_adapters, max_rank, in_features]
        b = self.b * self.mask[:, None, :]  # [num_adapters, out_features, max_rank]
        t = torch.bmm(xs, a.transpose(1, 2))  # [num_adapters, rows * seq, max_rank]
        d = torch.bmm(t, b.transpose(1, 2)) * self.scale[:, None, None]  # [num_adapters, rows * seq, out]
        return y + d.reshape(y.shape)

    def adapter_weights(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Adapter n's trained A [rank, in_features] and B [out_features, rank], detached and contiguous."""
        r = self.ranks[n]
        return self.a[n, :r].detach().clone().contiguous(), self.b[n, :, :r].detach().clone().contiguous()


Wrappers = dict[tuple[int, str], LoraLinear]  # (layer, module) -> its wrapper


def wrap(
    layers: nn.ModuleList,
    layer_ids: list[int],
    modules: list[str],
    ranks: list[int],
    alphas: list[float],
    generators: list[torch.Generator],
) -> Wrappers:
    """Swap a LoraLinear into each target linear of the given decoder layers, in layer then module order.

    Adapter n's A is drawn from generators[n], wrapper after wrapper in that order: an adapter's start
    depends on its own generator only, never on which other adapters train beside it.
    """
    wrappers: Wrappers = {}
    for i in layer_ids:
        for name in modules:
            parent = getattr(layers[i], LLAMA_MODULES[name])
            wrappers[(i, name)] = LoraLinear(getattr(parent, name), ranks, alphas, generators)
            setattr(parent, name, wrappers[(i, name)])
    return wrappers


def unwrap(layers: nn.ModuleList, wrappers: Wrappers) -> None:
    """Put the plain base linears back."""
    for (i, name), w in wrappers.items():
        setattr(getattr(layers[i], LLAMA_MODULES[name]), name, w.base)


def trainable(wrappers: Wrappers) -> list[nn.Parameter]:
    """Every wrapper's A and B: what the optimizer steps."""
    return [p for w in wrappers.values() for p in (w.a, w.b)]


def adapter_tensors(wrappers: Wrappers, n: int) -> ModuleTensors:
    """Adapter n's trained (A [rank, in_features], B [out_features, rank]) per (layer, module)."""
    return {key: w.adapter_weights(n) for key, w in wrappers.items()}


@torch.no_grad()
def load_adapter(wrappers: Wrappers, n: int, tensors: ModuleTensors) -> None:
    """Set adapter n's A and B to trained ones (A [rank, in_features], B [out_features, rank] per module)."""
    for key, (a, b) in tensors.items():
        w = wrappers[key]
        assert a.shape[0] == w.ranks[n], (key, a.shape, w.ranks[n])
        w.a[n, : w.ranks[n]] = a
        w.b[n, :, : w.ranks[n]] = b
