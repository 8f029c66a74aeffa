"""Training-time LoRA for one adapter on a Hugging Face Llama, in plain torch (no peft at run time)."""

from __future__ import annotations

import math

import torch
from torch import nn

from lorafleet.peft_format import ModuleTensors
from schemas.llama import LLAMA_MODULES


class LoraLinear(nn.Module):
    """y = x W^T + (alpha / rank) * (x A^T) B^T, with W frozen; B starts at zero, as in PEFT."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        out_features, in_features = base.weight.shape
        bound = 1.0 / math.sqrt(in_features)  # PEFT's kaiming_uniform(a=sqrt(5)) init of lora_A
        a = torch.empty(rank, in_features, dtype=base.weight.dtype).uniform_(
            -bound, bound, generator=generator
        )
        self.a = nn.Parameter(a)  # [rank, in_features]
        self.b = nn.Parameter(
            torch.zeros(out_features, rank, dtype=base.weight.dtype)
        )  # [out_features, rank]
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in_features] -> [..., out_features]
        return self.base(x) + (x @ self.a.T) @ self.b.T * self.scale


def wrap(
    layers: nn.ModuleList, layer_ids: list[int], modules: list[str], rank: int, alpha: float, seed: int
) -> dict[tuple[int, str], LoraLinear]:
    """Swap a LoraLinear into each target linear of the given decoder layers."""
    gen = torch.Generator().manual_seed(seed)
    wrappers: dict[tuple[int, str], LoraLinear] = {}
    for i in layer_ids:
        for name in sorted(modules):
            parent = getattr(layers[i], LLAMA_MODULES[name])
            wrappers[(i, name)] = LoraLinear(getattr(parent, name), rank, alpha, gen)
            setattr(parent, name, wrappers[(i, name)])
    return wrappers


def unwrap(layers: nn.ModuleList, wrappers: dict[tuple[int, str], LoraLinear]) -> ModuleTensors:
    """Put the base linears back; return each module's trained (A [rank, in], B [out, rank])."""
    tensors: ModuleTensors = {}
    for (i, name), w in wrappers.items():
        setattr(getattr(layers[i], LLAMA_MODULES[name]), name, w.base)
        tensors[(i, name)] = (w.a.detach().clone().contiguous(), w.b.detach().clone().contiguous())
    return tensors
