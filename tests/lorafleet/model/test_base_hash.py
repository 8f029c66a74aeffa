"""base_model_hash depends on the tensors only: not on shard layout, file order or metadata."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from lorafleet.model.base_hash import CACHE_FILE, base_model_hash, hash_tensors, read_entries


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.ones(16),
    }


def _write(dir_: Path, shards: list[dict[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(shards):
        save_file(shard, str(dir_ / f"model-{i:05d}-of-{len(shards):05d}.safetensors"), metadata=metadata)
    return dir_


def test_hash_has_the_sha256_form_and_is_stable(tmp_path: Path) -> None:
    d = _write(tmp_path / "a", [_tensors()])
    first = base_model_hash(d)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first)
    assert base_model_hash(d) == first
    assert (d / CACHE_FILE).is_file()


def test_resharding_and_metadata_do_not_change_the_hash(tmp_path: Path) -> None:
    tensors = _tensors()
    names = sorted(tensors)
    one = _write(tmp_path / "one", [tensors])
    two = _write(
        tmp_path / "two",
        [{n: tensors[n] for n in names[2:]}, {n: tensors[n] for n in names[:2]}],
        metadata={"format": "pt", "note": "resharded"},
    )
    assert base_model_hash(one) == base_model_hash(two)


def test_one_changed_value_changes_the_hash(tmp_path: Path) -> None:
    tensors = _tensors()
    changed = {k: v.clone() for k, v in tensors.items()}
    changed["model.layers.0.self_attn.q_proj.weight"][3, 5] += 1e-3
    assert base_model_hash(_write(tmp_path / "a", [tensors])) != base_model_hash(
        _write(tmp_path / "b", [changed])
    )


def test_rewritten_shard_invalidates_the_cache(tmp_path: Path) -> None:
    d = _write(tmp_path / "a", [_tensors(seed=0)])
    before = base_model_hash(d)
    _write(d, [_tensors(seed=1)])
    assert base_model_hash(d) != before
    assert base_model_hash(d) == base_model_hash(_write(tmp_path / "b", [_tensors(seed=1)]))


def test_renamed_tensor_changes_the_hash(tmp_path: Path) -> None:
    tensors = _tensors()
    renamed = dict(tensors)
    renamed["model.final_norm.weight"] = renamed.pop("model.norm.weight")
    assert base_model_hash(_write(tmp_path / "a", [tensors])) != base_model_hash(
        _write(tmp_path / "b", [renamed])
    )


def test_prepared_smollm2_cached_hash_equals_a_fresh_computation(smollm2_dir: Path) -> None:
    cached = base_model_hash(smollm2_dir)
    assert cached == base_model_hash(smollm2_dir)
    assert cached == hash_tensors(read_entries(sorted(smollm2_dir.glob("*.safetensors"))))


def test_cli_hash_prints_the_hash(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lorafleet.model.cli import app

    d = _write(tmp_path / "a", [_tensors()])
    result = CliRunner().invoke(app, ["hash", str(d)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == base_model_hash(d)
