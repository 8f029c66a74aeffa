"""A local PEFT LoRA folder as a registration describes it: its two files, checksum, rank, alpha and modules.

rank and target_modules come from the tensor names and shapes (the registry checks them against the same
tensors), alpha from adapter_config.json. The checksum is "sha256:" + the hex sha256 of the weights file,
as schemas/api.py defines it. The header is read with the safetensors library; the registry re-checks every
byte it fetches, so nothing here is a validation.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from lorafleet.client.errors import PeftDirError
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME

CHUNK = 1 << 20
# ...<module>.lora_A.weight / ...<module>.lora_B.weight: the adapted module's name and which factor
LORA_KEY_RE = re.compile(r"\.(\w+)\.lora_(A|B)\.weight$")


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
    """rank (the largest lora_A row count), alpha and the adapted modules of a PEFT folder."""
    from safetensors import SafetensorError, safe_open

    check_peft_dir(peft_dir)
    try:
        cfg = json.loads((peft_dir / ADAPTER_CONFIG_NAME).read_text())
        alpha = float(cfg["lora_alpha"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PeftDirError(f"{peft_dir / ADAPTER_CONFIG_NAME} has no numeric lora_alpha: {exc}") from exc
    modules: set[str] = set()
    rank = 0
    try:
        with safe_open(str(peft_dir / ADAPTER_WEIGHTS_NAME), framework="numpy") as f:
            for name in f.keys():
                m = LORA_KEY_RE.search(name)
                if m is None:
                    continue
                modules.add(m[1])
                if m[2] == "A":
                    rank = max(rank, int(f.get_slice(name).get_shape()[0]))
    except SafetensorError as exc:
        raise PeftDirError(f"{peft_dir / ADAPTER_WEIGHTS_NAME} is not a safetensors file: {exc}") from exc
    if rank == 0:
        raise PeftDirError(f"{peft_dir / ADAPTER_WEIGHTS_NAME} has no lora_A tensors")
    return PeftFacts(rank, alpha, sorted(modules))
