"""Real PEFT adapters on a tiny random Llama (made with the peft library), and broken variants of them."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from gateway.registry.validator.artifact_checks import verify_artifact
from gateway.registry.validator.artifact_fetch import Artifact
from lorafleet.adapter_rules.base_spec import BaseSpec
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from schemas.events import AdapterRegistered

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
TINY_BASE_HASH = "sha256:" + hashlib.sha256(json.dumps(TINY_CONFIG, sort_keys=True).encode()).hexdigest()
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_base_config(model_dir: Path) -> Path:
    """The served base as the registry sees it: only config.json is read."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_CONFIG))
    return model_dir


def make_peft_adapter(
    out_dir: Path, r: int = 4, alpha: float = 8.0, targets: list[str] | None = None
) -> Path:
    """Create a LoRA adapter with peft on a tiny random Llama and save it (adapter_config + safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG))
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or TARGETS, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.02)
    peft_model.save_pretrained(out_dir)
    return out_dir


def checksum(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def with_nan(src: Path, dst: Path) -> None:
    """Copy src with the first float32 value of the first tensor replaced by NaN."""
    header, data = read_safetensors(src)
    name = next(k for k in header if k != "__metadata__")
    start = header[name]["data_offsets"][0]
    data = data[:start] + struct.pack("<f", float("nan")) + data[start + 4 :]
    write_safetensors(dst, header, data)


def verify_on_tiny_base(
    peft_dir: Path, rank: int, alpha: float, targets: list[str], max_rank: int = 16
) -> None:
    """The validator's checks of the folder, registered with these facts on the tiny base (AdapterRejected
    when it is refused)."""
    weights = (peft_dir / ADAPTER_WEIGHTS_NAME).read_bytes()
    event = AdapterRegistered(
        adapter_id="acme-tiny",
        tenant_id="acme",
        version=1,
        base_model_hash=TINY_BASE_HASH,
        rank=rank,
        alpha=alpha,
        target_modules=targets,
        weights_uri="s3://lorafleet-adapters/adapters/acme/acme-tiny",
        checksum="sha256:" + hashlib.sha256(weights).hexdigest(),
    )
    artifact = Artifact((peft_dir / ADAPTER_CONFIG_NAME).read_bytes(), weights)
    verify_artifact(artifact, event, BaseSpec.from_config(TINY_CONFIG), max_rank, TINY_BASE_HASH)
