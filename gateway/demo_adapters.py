"""Small real PEFT LoRA adapters on the served base, made with the peft library (demo and tests)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME

log = logging.getLogger(__name__)


def make_peft_adapters(
    base_dir: Path, out_root: Path, names: list[str], base_hash: str, rank: int = 8, std: float = 0.01
) -> dict[str, Path]:
    """out_root/<name>/ with adapter_config.json (+ base_model_hash) and adapter_model.safetensors, one per
    name, each with its own random A and B (seeded by position). Existing complete folders are kept."""
    dirs = {name: out_root / name for name in names}
    missing = [n for n, d in dirs.items() if not (d / ADAPTER_WEIGHTS_NAME).is_file()]
    if not missing:
        return dirs
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    for name in missing:
        gen = torch.Generator().manual_seed(sum(name.encode()))
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        target = dirs[name]
        peft_model.save_pretrained(target)
        cfg_path = target / ADAPTER_CONFIG_NAME
        raw = json.loads(cfg_path.read_text())
        raw["base_model_hash"] = base_hash
        cfg_path.write_text(json.dumps(raw, indent=2))
        log.info("made PEFT adapter %s in %s", name, target)
    return dirs
