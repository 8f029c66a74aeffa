"""The model section: a Llama of the mode's shape with random weights and the production profile's slots."""

from __future__ import annotations

from typing import Any

import torch

from bench.gpu_sections.common import NUM_ADAPTERS, RANK, Bench
from bench.gpu_sections.modes import SHAPES
from lorafleet.sizing import PRODUCTION
from replica.lora.layers import LoraLinear
from replica.lora.replace import apply_lora
from replica.lora.row_layout import ModuleKey
from replica.model.fused import fuse_projections
from replica.model.llama import LlamaConfig, LlamaForCausalLM, rope_inv_freq
from schemas.llama import LLAMA_MODULES

ALL_TARGETS = list(LLAMA_MODULES)


def build_model(shape: str, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """A Llama of the named shape with random weights, allocated directly on device in dtype."""
    raw = {
        **SHAPES[shape],
        "model_type": "llama",
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
    config = LlamaConfig.from_dict(raw)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():  # [out, in] matrices get 1/sqrt(in); norm weights get ones
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.fill_(1.0)
    model.model.rotary_emb.inv_freq = rope_inv_freq(config).to(device)  # to_empty left it uninitialised
    fuse_projections(model)  # as replica.model.loader does once the weights are in
    return model.eval()


def fill_adapters(wrappers: dict[ModuleKey, LoraLinear]) -> None:
    """Random weights in the first NUM_ADAPTERS rank-16 slots (the decode and prefill adapters)."""
    arena = next(iter(wrappers.values())).pools[RANK].arena
    with torch.no_grad():
        arena.data[:NUM_ADAPTERS].normal_(0.0, 0.02)  # [slots, row_numel]
        arena.scales[:NUM_ADAPTERS].fill_(2.0)  # alpha 32 / r 16


def build(bench: Bench, out: dict[str, Any]) -> None:
    """Build the model as the loader does, then wrap all seven target modules with the production profile's
    slot pools as the replica does."""
    model = build_model(bench.mode.shape, bench.dtype, bench.device)
    weights = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    wrappers = apply_lora(model, ALL_TARGETS, dict(PRODUCTION.lora_slots))
    fill_adapters(wrappers)
    arenas = {bucket: pool.arena for bucket, pool in next(iter(wrappers.values())).pools.items()}
    bench.model, bench.wrappers = model, wrappers
    out.update(
        shape=SHAPES[bench.mode.shape],
        weight_bytes=sum(weights.values()),
        embedding_bytes=weights["model.embed_tokens.weight"],
        lora_slots={str(b): a.num_slots for b, a in arenas.items()},
        slot_bytes=sum(a.data.nbytes + a.scales.nbytes for a in arenas.values()),
        adapter_bytes={str(b): a.layout.row_numel * a.data.element_size() for b, a in arenas.items()},
    )
