"""Canary fixtures for tests: train on a tiny random Llama, and build a real engine over the canaries."""

from __future__ import annotations

from pathlib import Path

from canary.manifest import CanaryManifest
from canary.prompts import PromptSampler
from canary.tiny_base import TINY_CONFIG, write_tiny_base
from canary.train import TrainConfig, train_canaries
from replica.engine.engine import LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.lora.manager import LoraManager
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from replica.model.loader import load_model

MAX_RANK = 32


def train_tiny_canaries(root: Path, count: int, seed: int = 0) -> tuple[Path, Path, CanaryManifest]:
    """Write a tiny base under root/base and train `count` canaries (mixed ranks 8/16/32) into root/canaries."""
    base = write_tiny_base(root / "base", seed)
    out = root / "canaries"
    result = train_canaries(base, out, TrainConfig(count=count, seed=seed), progress=False)
    return base, out, result.manifest


def build_canary_engine(
    base: Path, out: Path, manifest: CanaryManifest, capacities: dict[int, int], max_num_seqs: int
) -> tuple[LLMEngine, LoraManager]:
    """Our model with LoRA slot pools, every canary validated into host RAM (none in a slot yet)."""
    model = load_model(base, "float32", "cpu")
    spec = AdapterSpec.for_model(model.config, manifest.target_modules, MAX_RANK, manifest.base_model_hash)
    manager = LoraManager(
        apply_lora(model, manifest.target_modules, capacities), capacities, host_capacity=512
    )
    for entry in manifest.adapters:
        manager.add_to_host(read_adapter(out / entry.path, entry.adapter_id, spec))
    runner = ModelRunner(model, max_num_seqs=max_num_seqs, max_model_len=64)
    return LLMEngine(runner, manager, {int(TINY_CONFIG["eos_token_id"])}), manager


def tiny_sampler() -> PromptSampler:
    """Chat-shaped token prompts for the tiny base (BOS, body, assistant turn)."""
    return PromptSampler(int(TINY_CONFIG["vocab_size"]), None, int(TINY_CONFIG["bos_token_id"]))
