"""The bundled GGUF becomes a plain Hugging Face directory that loads like any checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch
from safetensors import safe_open

from lorafleet.model.prepare import (
    EXPECTED_CONFIG,
    bundled_gguf_path,
    ensure_default_model,
    remove_stale_temp_dirs,
    temp_prefix,
)

PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def test_config_matches_the_design_without_quantization(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert {k: config[k] for k in EXPECTED_CONFIG} == EXPECTED_CONFIG
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_weights_are_fp32_with_a_separate_lm_head_copy(smollm2_dir: Path) -> None:
    with safe_open(str(smollm2_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert len(names) == 2 + 30 * 9 + 1  # embed, head, final norm; 9 tensors per layer
    assert head.dtype == torch.float32 and head.shape == (49152, 576)
    assert torch.equal(head, embed)


def test_logits_equal_transformers_reading_the_gguf(smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    gguf = bundled_gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    prepared = LlamaForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = direct(ids).logits  # [1, seq, vocab]
        got = prepared(ids).logits
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_second_call_returns_the_same_directory_without_rewriting(smollm2_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    assert ensure_default_model(smollm2_dir) == smollm2_dir
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


def test_no_temporary_directory_is_left_beside_the_model(smollm2_dir: Path) -> None:
    leftovers = [p.name for p in smollm2_dir.parent.iterdir() if p.name.startswith(temp_prefix(smollm2_dir))]
    assert leftovers == []


def test_temp_dirs_of_dead_conversions_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    out_dir = tmp_path / "model"
    dead = _dead_pid()
    stale = tmp_path / f"{temp_prefix(out_dir)}{dead}-abc"
    live = tmp_path / f"{temp_prefix(out_dir)}{os.getpid()}-def"
    for d in (stale, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    remove_stale_temp_dirs(out_dir)
    assert not stale.exists() and live.exists()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_tokenizer_files_name_the_real_eos_and_carry_the_chat_template(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["bos_token"] == "<|im_start|>"
    assert "<|im_start|>" in config["chat_template"]
    assert generation["eos_token_id"] == 2


def test_cli_prepare_prints_the_directory_and_its_hash(smollm2_dir: Path) -> None:
    from typer.testing import CliRunner

    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.cli import app

    result = CliRunner().invoke(app, ["prepare", "--out", str(smollm2_dir)])
    assert result.exit_code == 0, result.output
    assert f"model_dir: {smollm2_dir}" in result.stdout
    assert f"base_model_hash: {base_model_hash(smollm2_dir)}" in result.stdout
