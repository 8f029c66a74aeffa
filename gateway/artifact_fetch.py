"""Fetch an adapter's two files from the object store with size caps; transient failures stay retryable.

The folder is listed first: a pickle file anywhere under it rejects the version (nothing is opened), and a
missing config or weights file rejects it too. Bodies are read in chunks and abandoned past their cap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from gateway.artifact_checks import ArtifactRejected
from gateway.weights_uri import ObjectLocation
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, artifact_keys

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
CHUNK = 1 << 20


class TransientFetchError(Exception):
    """The object store did not answer properly; the event is retried, the version stays pending."""


@dataclass(frozen=True)
class Artifact:
    config: bytes
    weights: bytes


def _classify(exc: Exception, what: str) -> Exception:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in MISSING_CODES:
            return ArtifactRejected("artifact_missing", f"{what} does not exist in the object store")
        if code in {"AccessDenied", "403"}:
            return ArtifactRejected("artifact_forbidden", f"{what} is not readable by the registry")
    return TransientFetchError(f"object store error reading {what}: {exc}")


async def _list(s3, location: ObjectLocation) -> dict[str, int]:
    """Relative name -> size for every object under the folder."""
    found: dict[str, int] = {}
    paginator = s3.get_paginator("list_objects_v2")
    prefix = location.key + "/"
    async for page in paginator.paginate(Bucket=location.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"][len(prefix) :]] = int(obj["Size"])
    return found


async def _get(s3, bucket: str, key: str, cap: int) -> bytes:
    resp = await s3.get_object(Bucket=bucket, Key=key)
    body, parts, total = resp["Body"], [], 0
    try:
        async for chunk in body.iter_chunks(CHUNK):
            total += len(chunk)
            if total > cap:
                raise ArtifactRejected("adapter_too_large", f"{key.rsplit('/', 1)[-1]} exceeds {cap} bytes")
            parts.append(chunk)
    finally:
        body.close()
    return b"".join(parts)


async def fetch_artifact(
    s3, location: ObjectLocation, max_config_bytes: int, max_weights_bytes: int
) -> Artifact:
    """Read adapter_config.json and adapter_model.safetensors from the PEFT folder at location."""
    try:
        listing = await _list(s3, location)
    except (ClientError, BotoCoreError) as exc:
        raise _classify(exc, "the adapter folder") from exc
    pickles = sorted(name for name in listing if name.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ArtifactRejected("unsupported_format", f"pickle files are refused: {pickles[:5]}")
    for name, cap in ((ADAPTER_CONFIG_NAME, max_config_bytes), (ADAPTER_WEIGHTS_NAME, max_weights_bytes)):
        if name not in listing:
            raise ArtifactRejected("artifact_missing", f"{name} is missing from the adapter folder")
        if listing[name] > cap:
            raise ArtifactRejected("adapter_too_large", f"{name} is {listing[name]} bytes, over {cap}")
    config_key, weights_key = artifact_keys(location.key)
    try:
        config = await _get(s3, location.bucket, config_key, max_config_bytes)
        weights = await _get(s3, location.bucket, weights_key, max_weights_bytes)
    except (ClientError, BotoCoreError) as exc:
        raise _classify(exc, "an adapter file") from exc
    return Artifact(config, weights)
