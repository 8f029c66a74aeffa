"""Swap LoraLinear wrappers into a built Llama (the model file itself knows nothing of LoRA)."""

from __future__ import annotations

from torch import nn

from replica.lora.arena import build_arenas
from replica.lora.layers import LoraLinear
from replica.lora.row_layout import ModuleKey
from replica.lora.spec import MODULE_PARENTS
from replica.model.llama import LlamaForCausalLM


def lora_layers(bases: dict[ModuleKey, nn.Linear], capacities: dict[int, int]) -> dict[ModuleKey, LoraLinear]:
    """Wrap each base linear; their slot pools are views into one arena per rank bucket (shared rows)."""
    if not bases:
        return {}
    first = next(iter(bases.values())).weight
    shapes = {key: (lin.weight.shape[1], lin.weight.shape[0]) for key, lin in bases.items()}
    arenas = build_arenas(shapes, capacities, first.dtype, first.device)
    return {
        key: LoraLinear(lin, {rank: arena.pool(key) for rank, arena in arenas.items()})
        for key, lin in bases.items()
    }


def apply_lora(
    model: LlamaForCausalLM, target_modules: list[str], capacities: dict[int, int]
) -> dict[ModuleKey, LoraLinear]:
    """Wrap every target linear of every layer; return the wrappers keyed by (layer index, module name)."""
    bases: dict[ModuleKey, nn.Linear] = {}
    for i, layer in enumerate(model.model.layers):
        for name in target_modules:
            current = getattr(getattr(layer, MODULE_PARENTS[name]), name)
            bases[(i, name)] = current.base if isinstance(current, LoraLinear) else current
    wrappers = lora_layers(bases, capacities)
    for (i, name), wrapper in wrappers.items():
        setattr(getattr(model.model.layers[i], MODULE_PARENTS[name]), name, wrapper)
    return wrappers
