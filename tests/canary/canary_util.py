"""Canary fixtures for tests: train on a tiny random Llama, and serve the canaries the way a replica does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from canary.churn import KV_BLOCK_SIZE, KV_CACHE_BYTES
from canary.manifest import CanaryManifest
from canary.prompts import PromptSampler
from canary.tiny_base import TINY_CONFIG, write_tiny_base
from canary.train import TrainConfig, train_canaries
from replica.adapter_cache.gpu import GpuTier
from replica.config import ReplicaSettings
from replica.engine.engine import LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.loader import load_model
from replica.runtime import Replica, build_replica
from tests.replica.cache_util import local_cache
from tests.replica.engine.engine_util import Served

MAX_RANK = 32
MAX_MODEL_LEN = 64


def train_tiny_canaries(root: Path, count: int, seed: int = 0) -> tuple[Path, Path, CanaryManifest]:
    """Write a tiny base under root/base and train `count` canaries (mixed ranks 8/16/32) into root/canaries."""
    base = write_tiny_base(root / "base", seed)
    out = root / "canaries"
    result = train_canaries(base, out, TrainConfig(count=count, seed=seed), progress=False)
    return base, out, result.manifest


def canary_dirs(out: Path, manifest: CanaryManifest) -> dict[str, Path]:
    return {e.adapter_id: out / e.path for e in manifest.adapters}


def canary_replica(
    base: Path,
    out: Path,
    manifest: CanaryManifest,
    capacities: dict[int, int],
    max_num_seqs: int,
    cache_dir: Path,
) -> Replica:
    """A replica (not started) over the tiny base serving every canary from its folder; none loaded yet."""
    settings = ReplicaSettings(
        model_dir=base,
        device="cpu",
        base_model_hash=manifest.base_model_hash,
        max_num_seqs=max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=KV_CACHE_BYTES,
        kv_block_size=KV_BLOCK_SIZE,
        lora_slots=capacities,
        max_lora_rank=MAX_RANK,
        lora_target_modules=manifest.target_modules,
        adapter_dirs=canary_dirs(out, manifest),
        registry_url=None,
        control_enabled=False,
        cache_dir=cache_dir,
    )
    return build_replica(settings)


def build_canary_engine(
    base: Path,
    out: Path,
    manifest: CanaryManifest,
    capacities: dict[int, int],
    max_num_seqs: int,
    cache_dir: Path,
) -> Served:
    """Our model with LoRA slot pools and an engine stepped by the test; the canaries come in through the
    adapter cache (none loaded yet)."""
    model = load_model(base, "float32", "cpu")
    spec = AdapterSpec.for_model(model.config, manifest.target_modules, MAX_RANK, manifest.base_model_hash)
    gpu = GpuTier(apply_lora(model, manifest.target_modules, capacities), capacities)
    runner = ModelRunner(model, max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN)
    engine = LLMEngine(runner, gpu, {int(TINY_CONFIG["eos_token_id"])})
    return Served(engine, local_cache(spec, gpu, canary_dirs(out, manifest), cache_dir))


def tiny_sampler() -> PromptSampler:
    """Chat-shaped token prompts for the tiny base (BOS, body, assistant turn)."""
    return PromptSampler(int(TINY_CONFIG["vocab_size"]), None, int(TINY_CONFIG["bos_token_id"]))


def with_byte_tokenizer(base: Path, dest: Path) -> Path:
    """A copy of the tiny base with a byte-level tokenizer.json (its specials, one token per byte, filler
    tokens up to the vocabulary), so the grammar engine can mask its rows; the weights are the same."""
    shutil.copytree(base, dest)
    specials = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2: the tiny base's pad, bos and eos
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    fillers = [f"<extra_{i}>" for i in range(len(vocab), int(TINY_CONFIG["vocab_size"]))]
    vocab |= {t: len(vocab) + i for i, t in enumerate(fillers)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials + fillers)
    tokenizer.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return dest
