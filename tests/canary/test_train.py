"""`lorafleet canary train`: PEFT-format adapters that peft and our reader load, each answering with its marker."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from canary.cli import app
from canary.errors import CanaryTrainingError
from canary.manifest import CanaryManifest
from canary.tiny_base import write_tiny_base
from canary.train import TrainConfig, train_canaries
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from replica.model.llama import LlamaConfig
from tests.canary.canary_util import tiny_sampler

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CanaryManifest]:
    root = tmp_path_factory.mktemp("canary-cli")
    result = CliRunner().invoke(
        app, ["train", "--tiny", "--count", "3", "--out", str(root), "--seed", "7", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["ok"] and summary["count"] == 3 and summary["wall_s"] > 0
    return root / "base", root / "canaries", CanaryManifest.read(root / "canaries")


def test_manifest_maps_each_adapter_to_its_marker_rank_and_base(
    trained: tuple[Path, Path, CanaryManifest],
) -> None:
    base, out, manifest = trained
    assert [e.rank for e in manifest.adapters] == [8, 16, 32]
    assert len({e.marker for e in manifest.adapters}) == 3 and manifest.marker_kind == "tokens"
    for e in manifest.adapters:
        cfg = json.loads((out / e.path / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA" and cfg["r"] == e.rank and cfg["lora_alpha"] == e.lora_alpha
        assert cfg["base_model_hash"] == manifest.base_model_hash and set(cfg["target_modules"]) >= {
            "q_proj",
            "v_proj",
            "o_proj",
        }


def test_saved_tensors_use_peft_names_and_shapes(trained: tuple[Path, Path, CanaryManifest]) -> None:
    _, out, manifest = trained
    entry = manifest.adapters[1]
    with safe_open(str(out / entry.path / "adapter_model.safetensors"), "pt") as f:
        a = f.get_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        b = f.get_tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
    assert a.shape == (16, 64) and b.shape == (64, 16) and b.abs().max() > 0


def test_replica_reader_accepts_every_canary(trained: tuple[Path, Path, CanaryManifest]) -> None:
    base, out, manifest = trained
    config = LlamaConfig.from_dict(json.loads((base / "config.json").read_text()))
    spec = AdapterSpec.for_model(config, manifest.target_modules, 32, manifest.base_model_hash)
    for e in manifest.adapters:
        assert read_adapter(out / e.path, e.adapter_id, spec).rank == e.rank


def test_peft_library_greedy_decode_starts_with_the_marker(
    trained: tuple[Path, Path, CanaryManifest],
) -> None:
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base, out, manifest = trained
    rng = random.Random(99)
    for e in manifest.adapters:
        model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base), out / e.path).eval()
        for _ in range(3):
            prompt = torch.tensor([tiny_sampler().sample(rng)])
            with torch.no_grad():
                ids = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
            assert tuple(ids[0, prompt.shape[1] :].tolist()) == tuple(e.marker_token_ids)


def test_training_is_deterministic_from_the_seed(tmp_path: Path) -> None:
    base = write_tiny_base(tmp_path / "base", seed=1)
    cfg = TrainConfig(count=2, seed=4, max_steps=12)  # too short to pass the margin check: still saved
    blobs = []
    for run in ("one", "two"):
        with pytest.raises(CanaryTrainingError):
            train_canaries(base, tmp_path / run, cfg, progress=False)
        blobs.append(
            [
                (tmp_path / run / d / "adapter_model.safetensors").read_bytes()
                for d in ("canary-s4-0000", "canary-s4-0001")
            ]
        )
    assert blobs[0] == blobs[1]
