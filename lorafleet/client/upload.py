"""Put a local PEFT folder into the object store in the layout a registration's weights_uri names."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lorafleet.client.peft_dir import check_peft_dir, weights_checksum
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, artifact_keys

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client


def artifact_prefix(tenant_id: str, adapter_id: str) -> str:
    """The key prefix a version's folder gets by default: adapters/<tenant>/<adapter id>."""
    return f"adapters/{tenant_id}/{adapter_id}"


async def upload_peft_dir(s3: S3Client, peft_dir: Path, bucket: str, key_prefix: str) -> str:
    """Upload the config and the weights under s3://bucket/key_prefix; return the weights checksum."""
    check_peft_dir(peft_dir)
    config_key, weights_key = artifact_keys(key_prefix)
    await s3.put_object(Bucket=bucket, Key=config_key, Body=(peft_dir / ADAPTER_CONFIG_NAME).read_bytes())
    await s3.put_object(Bucket=bucket, Key=weights_key, Body=(peft_dir / ADAPTER_WEIGHTS_NAME).read_bytes())
    return weights_checksum(peft_dir)
