"""A local PEFT LoRA folder as a registration describes it: its two files, checksum, rank, alpha and modules.

rank and target_modules come from the tensor names and shapes (the registry checks them against the same
tensors), alpha from adapter_config.json, all read with the adapter rules' own parsers
(lorafleet.adapter_rules): a folder whose config, header or tensor pairs those rules refuse is refused
here, with the rule's code, before anything is uploaded. The checksum is "sha256:" + the hex sha256 of the
weights file, as schemas/api.py defines it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.lora_tensors import describe
from lorafleet.adapter_rules.peft_config import parse_adapter_config
from lorafleet.adapter_rules.safetensors_header import parse_header
from lorafleet.client.errors import PeftDirError
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME

CHUNK = 1 << 20


@dataclass(frozen=True)
class PeftFacts:
    """What a registration declares about its folder."""

    rank: int
    alpha: float
    target_modules: list[str]


def check_peft_dir(peft_dir: Path) -> None:
    """Raise PeftDirError unless peft_dir holds adapter_config.json and adapter_model.safetensors."""
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        if not (peft_dir / name).is_file():
            raise PeftDirError(f"{peft_dir} has no {name}; only safetensors PEFT folders are registered")


def weights_checksum(peft_dir: Path) -> str:
    """'sha256:' + hex sha256 of adapter_model.safetensors: the registration's checksum."""
    h = hashlib.sha256()
    with (peft_dir / ADAPTER_WEIGHTS_NAME).open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def describe_peft_dir(peft_dir: Path) -> PeftFacts:
    """rank (the largest module rank), alpha (lora_alpha) and the adapted modules of a PEFT folder."""
    check_peft_dir(peft_dir)
    try:
        cfg = parse_adapter_config((peft_dir / ADAPTER_CONFIG_NAME).read_bytes())
        rank, modules = describe(parse_header((peft_dir / ADAPTER_WEIGHTS_NAME).read_bytes()))
    except AdapterRejected as exc:
        raise PeftDirError(f"{peft_dir}: {exc.message} ({exc.code.value})") from exc
    return PeftFacts(rank, cfg.lora_alpha, modules)
