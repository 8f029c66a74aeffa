from __future__ import annotations

import shutil
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
