"""Merged mode: fold one adapter into the base weights (W += scale * B @ A) for a dedicated replica."""

from __future__ import annotations

import torch

from replica.lora.layers import LoraLinear
from replica.lora.spec import MODULE_PARENTS
from replica.lora.weights import AdapterWeights
from replica.model.llama import LlamaForCausalLM


@torch.no_grad()
def merge_adapter(model: LlamaForCausalLM, adapter: AdapterWeights) -> None:
    """Add each module's scale * B A into its base weight (computed in fp32, stored in the weight's dtype)."""
    for (layer, name), lora in adapter.modules.items():
        linear = getattr(getattr(model.model.layers[layer], MODULE_PARENTS[name]), name)
        if isinstance(linear, LoraLinear):
            linear = linear.base
        w = linear.weight  # [out_features, in_features]
        delta = lora.scale * (lora.b.float() @ lora.a.float())  # [out_features, in_features]
        w.copy_((w.float() + delta.to(w.device)).to(w.dtype))
