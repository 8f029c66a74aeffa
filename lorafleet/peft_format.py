"""Write one adapter as a PEFT LoRA directory: adapter_config.json plus adapter_model.safetensors.

The key names and config fields are the ones peft's save_pretrained writes for a Llama, so the same
directory loads with PeftModel.from_pretrained and passes the registry's and the replica's checks; the
config also carries base_model_hash, which the replica checks before an adapter may take a slot. Writing
needs torch and safetensors only, never peft: runtime commands (the demo, the load test) use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from schemas.llama import LLAMA_MODULES

ModuleTensors = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> (A, B)


def peft_key(layer: int, module: str, which: str) -> str:
    """PEFT's tensor name for lora_A or lora_B of one module of one decoder layer."""
    return f"base_model.model.model.layers.{layer}.{LLAMA_MODULES[module]}.{module}.lora_{which}.weight"


def adapter_config(
    rank: int,
    alpha: float,
    target_modules: list[str],
    base_model_name_or_path: str,
    base_model_hash: str,
    layers: list[int] | None = None,
) -> dict[str, object]:
    """The adapter_config.json fields peft reads for a plain LoRA on a causal LM (on `layers` if given)."""
    config: dict[str, object] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": base_model_name_or_path,
        "base_model_hash": base_model_hash,
    }
    if layers is not None:
        config["layers_to_transform"] = sorted(layers)
    return config


def save_peft_adapter(out_dir: Path, tensors: ModuleTensors, config: dict[str, object]) -> Path:
    """Write the directory (A [rank, in_features], B [out_features, rank] per module) and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    flat: dict[str, torch.Tensor] = {}
    for (layer, module), (a, b) in sorted(tensors.items()):
        flat[peft_key(layer, module, "A")] = a.contiguous()
        flat[peft_key(layer, module, "B")] = b.contiguous()
    save_file(flat, str(out_dir / ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
