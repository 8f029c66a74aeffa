"""Swap LoraLinear wrappers into a built Llama (the model file itself knows nothing of LoRA)."""

from __future__ import annotations

from replica.lora.layers import LoraLinear
from replica.lora.spec import MODULE_PARENTS
from replica.lora.weights import ModuleKey
from replica.model.llama import LlamaForCausalLM


def apply_lora(
    model: LlamaForCausalLM, target_modules: list[str], capacities: dict[int, int]
) -> dict[ModuleKey, LoraLinear]:
    """Wrap every target linear of every layer; return the wrappers keyed by (layer index, module name)."""
    wrappers: dict[ModuleKey, LoraLinear] = {}
    for i, layer in enumerate(model.model.layers):
        for name in target_modules:
            parent = getattr(layer, MODULE_PARENTS[name])
            current = getattr(parent, name)
            base = current.base if isinstance(current, LoraLinear) else current
            wrapper = LoraLinear(base, capacities)
            setattr(parent, name, wrapper)
            wrappers[(i, name)] = wrapper
    return wrappers
