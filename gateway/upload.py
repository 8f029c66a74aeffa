"""Put a local PEFT folder into the object store in the layout weights_uri names, and compute its checksum."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gateway.weights_uri import ObjectLocation
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, artifact_keys

CHUNK = 1 << 20


class PeftDirError(ValueError):
    """The local folder is not a PEFT LoRA folder we can register."""


def weights_checksum(peft_dir: Path) -> str:
    """'sha256:' + hex sha256 of adapter_model.safetensors: the registration's checksum."""
    h = hashlib.sha256()
    with (peft_dir / ADAPTER_WEIGHTS_NAME).open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def check_peft_dir(peft_dir: Path) -> None:
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        if not (peft_dir / name).is_file():
            raise PeftDirError(f"{peft_dir} has no {name}; only safetensors PEFT folders are registered")


async def upload_peft_dir(s3, peft_dir: Path, location: ObjectLocation) -> str:
    """Upload the config and the weights under location; return the weights checksum."""
    check_peft_dir(peft_dir)
    config_key, weights_key = artifact_keys(location.key)
    await s3.put_object(
        Bucket=location.bucket, Key=config_key, Body=(peft_dir / ADAPTER_CONFIG_NAME).read_bytes()
    )
    await s3.put_object(
        Bucket=location.bucket, Key=weights_key, Body=(peft_dir / ADAPTER_WEIGHTS_NAME).read_bytes()
    )
    return weights_checksum(peft_dir)
