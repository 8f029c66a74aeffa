"""Our Llama equals transformers' LlamaForCausalLM on the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replica.model.loader import load_model, read_config


def _hf_logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids[None]).logits[0].float()


def _our_logits(model_dir: Path, ids: torch.Tensor, dtype: str = "float32") -> torch.Tensor:
    model = load_model(model_dir, dtype=dtype, device="cpu")
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.shape[0]))
        return model.compute_logits(hidden)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama3_dir"])
def test_tiny_logits_match_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(fixture)
    ids = torch.randint(0, 320, (100,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(_our_logits(model_dir, ids), _hf_logits(model_dir, ids), atol=1e-4, rtol=1e-4)


def test_llama3_rope_scaling_is_applied(tiny_llama3_dir: Path) -> None:
    config = read_config(tiny_llama3_dir)
    assert config.rope_scaling and config.rope_scaling["rope_type"] == "llama3"
    assert not config.tie_word_embeddings and config.num_key_value_heads < config.num_attention_heads


def test_bf16_load_is_close_to_fp32(tiny_model_dir: Path) -> None:
    ids = torch.arange(40)
    fp32, bf16 = _our_logits(tiny_model_dir, ids), _our_logits(tiny_model_dir, ids, "bfloat16")
    assert (fp32.argmax(-1) == bf16.argmax(-1)).float().mean() > 0.9


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2_dir: Path) -> None:
    ids = torch.randint(0, 49152, (64,), generator=torch.Generator().manual_seed(5))
    ours, ref = _our_logits(smollm2_dir, ids), _hf_logits(smollm2_dir, ids)
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
