"""Make real PEFT adapters (with non-zero B) for tests, and build our model with LoRA from a directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from replica.adapter_cache.gpu import GpuTier
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.llama import LlamaForCausalLM
from replica.model.loader import load_model

TEST_BASE_HASH = "sha256:" + "ab" * 32
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class AdapterRecipe:
    name: str
    r: int
    alpha: float
    targets: tuple[str, ...] = tuple(ALL_TARGETS)
    use_rslora: bool = False
    seed: int = 0
    rank_pattern: tuple[tuple[str, int], ...] = ()  # PEFT's per-module overrides, in order
    alpha_pattern: tuple[tuple[str, float], ...] = ()


def make_peft_adapters(
    base_dir: Path,
    out_dir: Path,
    recipes: list[AdapterRecipe],
    base_hash: str = TEST_BASE_HASH,
    std: float = 0.05,
):
    """Create adapters with the peft library on one transformers model; return (peft_model, {name: dir})."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM as HFLlama

    hf = HFLlama.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
    peft_model = None
    for rec in recipes:
        cfg = LoraConfig(
            r=rec.r,
            lora_alpha=rec.alpha,
            target_modules=list(rec.targets),
            use_rslora=rec.use_rslora,
            rank_pattern=dict(rec.rank_pattern),
            alpha_pattern=dict(rec.alpha_pattern),
            lora_dropout=0.0,
            task_type="CAUSAL_LM",
        )
        if peft_model is None:
            peft_model = get_peft_model(hf, cfg, adapter_name=rec.name)
        else:
            peft_model.add_adapter(rec.name, cfg)
        gen = torch.Generator().manual_seed(rec.seed)
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if f"lora_B.{rec.name}." in pname or f"lora_A.{rec.name}." in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
    dirs: dict[str, Path] = {}
    for rec in recipes:
        target = out_dir / rec.name
        peft_model.save_pretrained(target, selected_adapters=[rec.name])
        found = [p.parent for p in target.rglob("adapter_config.json")][0]
        cfg_path = found / "adapter_config.json"
        raw = json.loads(cfg_path.read_text())
        raw["base_model_hash"] = base_hash
        cfg_path.write_text(json.dumps(raw))
        dirs[rec.name] = found
    peft_model.eval()
    return peft_model, dirs


def build_lora_model(
    base_dir: Path, capacities: dict[int, int], max_rank: int = 64, base_hash: str = TEST_BASE_HASH
) -> tuple[LlamaForCausalLM, GpuTier, AdapterSpec]:
    """Our model with LoRA wrappers on every target, its GPU tier and the spec adapters are checked against."""
    model = load_model(base_dir, "float32", "cpu")
    spec = AdapterSpec.for_model(model.config, ALL_TARGETS, max_rank, base_hash)
    return model, GpuTier(apply_lora(model, ALL_TARGETS, capacities), capacities), spec
