from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica.errors import UnsupportedModelError
from replica.model.loader import load_model


def test_a_checkpoint_bias_the_config_turned_off_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    (weights,) = tmp_path.glob("*.safetensors")
    tensors = load_file(weights)
    q_out = tensors["model.layers.0.self_attn.q_proj.weight"].shape[0]
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(q_out)  # attention_bias is false
    save_file(tensors, weights)
    with pytest.raises(UnsupportedModelError, match="q_proj.bias has no place in the model"):
        load_model(tmp_path, device="cpu")


def _copy_with(tiny_model_dir: Path, tmp_path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    (weights,) = tmp_path.glob("*.safetensors")
    tensors = load_file(weights)
    edit(tensors)
    save_file(tensors, weights)
    return tmp_path


def test_a_missing_projection_is_named_even_though_it_is_fused(tiny_model_dir: Path, tmp_path: Path) -> None:
    def drop_k(tensors: dict[str, torch.Tensor]) -> None:
        del tensors["model.layers.1.self_attn.k_proj.weight"]

    model_dir = _copy_with(tiny_model_dir, tmp_path, drop_k)
    with pytest.raises(UnsupportedModelError, match=r"lacks 1 tensors.*layers\.1\.self_attn\.k_proj\.weight"):
        load_model(model_dir, device="cpu")


def test_loaded_weights_hold_no_page_of_the_checkpoint_file(tiny_model_dir: Path) -> None:
    # a replica's memory would hold the file's pages besides its own copy of every fused projection
    model = load_model(tiny_model_dir, "float32", "cpu")
    (weights,) = tiny_model_dir.glob("*.safetensors")
    assert str(weights.resolve()) not in Path("/proc/self/maps").read_text()
    checkpoint = load_file(weights)
    for name, tensor in checkpoint.items():  # each part reads back as its view of the fused weight
        module_path, _, leaf = name.rpartition(".")
        assert torch.equal(getattr(model.get_submodule(module_path), leaf), tensor), name


def test_a_bfloat16_checkpoint_loads_as_float32_in_one_copy(tiny_model_dir: Path, tmp_path: Path) -> None:
    def to_bf16(tensors: dict[str, torch.Tensor]) -> None:
        tensors.update({k: v.to(torch.bfloat16) for k, v in tensors.items()})

    model = load_model(_copy_with(tiny_model_dir, tmp_path, to_bf16), "float32", "cpu")
    q, qkv = (
        model.get_submodule(f"model.layers.0.self_attn.{name}").weight for name in ("q_proj", "qkv_proj")
    )
    assert isinstance(q, torch.Tensor) and isinstance(qkv, torch.Tensor)
    assert q.dtype == torch.float32 and q.data_ptr() == qkv.data_ptr()
