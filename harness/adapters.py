"""Random PEFT LoRA adapters on the served base (load test, benchmarks and tests), written without peft."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.peft_format import ModuleTensors, adapter_config, save_peft_adapter
from schemas.api import ADAPTER_WEIGHTS_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RandomLora:
    """What to draw: A ~ N(0, 1/in_features) keeps x·A the size of x; b_std is B's scale."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    b_std: float = 0.01


def random_tensors(spec: BaseSpec, lora: RandomLora, seed: int) -> ModuleTensors:
    """(layer, module) -> (A [rank, in_features], B [out_features, rank]), the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    tensors: ModuleTensors = {}
    for layer in range(spec.num_layers):
        for module in sorted(lora.target_modules):
            fan_in, fan_out = spec.shapes[module]
            a = torch.randn(lora.rank, fan_in, generator=gen) * fan_in**-0.5
            b = torch.randn(fan_out, lora.rank, generator=gen) * lora.b_std
            tensors[(layer, module)] = (a, b)
    return tensors


def write_random_adapter(base_dir: Path, out_dir: Path, lora: RandomLora, seed: int, base_hash: str) -> Path:
    """out_dir as a PEFT LoRA directory for the base in base_dir (its config carries base_hash)."""
    tensors = random_tensors(BaseSpec.from_model_dir(base_dir), lora, seed)
    config = adapter_config(lora.rank, lora.alpha, list(lora.target_modules), str(base_dir), base_hash)
    return save_peft_adapter(out_dir, tensors, config)


def make_peft_adapters(
    base_dir: Path, out_root: Path, names: list[str], base_hash: str, rank: int = 8, std: float = 0.01
) -> dict[str, Path]:
    """out_root/<name>/ with adapter_config.json (+ base_model_hash) and adapter_model.safetensors, one per
    name, on q_proj and v_proj, each with its own random A and B (seeded by name; B's std is `std`).
    Existing complete folders are kept."""
    lora = RandomLora(rank=rank, alpha=2 * rank, target_modules=("q_proj", "v_proj"), b_std=std)
    dirs = {name: out_root / name for name in names}
    for name, target in dirs.items():
        if not (target / ADAPTER_WEIGHTS_NAME).is_file():
            write_random_adapter(base_dir, target, lora, sum(name.encode()), base_hash)
            log.info("made PEFT adapter %s in %s", name, target)
    return dirs
