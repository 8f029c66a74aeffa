"""A tiny random Llama checkpoint (same architecture as the served base) for canary tests and --tiny runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FINAL_NORM_SCALE = 4.0
TINY_CONFIG: dict[str, Any] = dict(  # LlamaConfig keyword arguments
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def write_tiny_base(path: Path, seed: int = 0) -> Path:
    """Save a random fp32 transformers LlamaForCausalLM (safetensors) to path; deterministic from seed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM

    gen = torch.Generator().manual_seed(seed)
    with torch.device("cpu"):
        model = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG))
    with torch.no_grad():  # the default init (std 0.02) gives near-flat logits; widen it
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        # a trained LM head is sharp; with a unit final norm the logits of this base stay within a few
        # units of each other and no adapter could make one token win by a clear margin
        model.model.norm.weight.fill_(FINAL_NORM_SCALE)
    model.save_pretrained(path, safe_serialization=True)
    return Path(path)
