"""Shared fixtures: tiny random Llama checkpoints written by transformers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)


def write_tiny_checkpoint(path: Path, seed: int = 0, **overrides: object) -> Path:
    """Save a random transformers LlamaForCausalLM (fp32, safetensors) to path and return it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # default init is tiny (std 0.02); widen it so logits are well separated
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GQA Llama with tied embeddings."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GQA Llama with untied embeddings and Llama-3 rope scaling."""
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny3"),
        seed=1,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
