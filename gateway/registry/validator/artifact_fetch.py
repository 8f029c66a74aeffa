"""Fetch an adapter's two files from the object store with size caps; transient failures stay retryable.

The folder is listed first: a pickle file anywhere under it rejects the version (nothing is opened), and a
missing config or weights file rejects it too. Bodies are read in chunks and abandoned past their cap.
The whole fetch runs under a FetchPolicy (lorafleet.fetch_retry): a transient failure (a 5xx, a broken or
stalled stream) is tried again a few times with jittered backoff, and a fetch still not done at the
deadline raises TransientFetchError, so the version stays pending and the event is retried later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from gateway.registry.weights_uri import ObjectLocation
from lorafleet.adapter_rules.artifact import check_files
from lorafleet.adapter_rules.caps import check_size
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.fetch_retry import FetchPolicy, fetch_with_retry
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, artifact_keys

if TYPE_CHECKING:  # a stub-only package (dev extras)
    from types_aiobotocore_s3 import S3Client

log = logging.getLogger(__name__)

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
            return AdapterRejected(RejectCode.ARTIFACT_MISSING, f"{what} does not exist in the object store")
        if code in {"AccessDenied", "403"}:
            return AdapterRejected(RejectCode.ARTIFACT_FORBIDDEN, f"{what} is not readable by the registry")
    return TransientFetchError(f"object store error reading {what}: {exc}")


async def _list(s3: S3Client, location: ObjectLocation) -> dict[str, int]:
    """Relative name -> size for every object under the folder."""
    found: dict[str, int] = {}
    paginator = s3.get_paginator("list_objects_v2")
    prefix = location.key + "/"
    async for page in paginator.paginate(Bucket=location.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"][len(prefix) :]] = int(obj["Size"])
    return found


async def _get(s3: S3Client, bucket: str, key: str, cap: int) -> bytes:
    resp = await s3.get_object(Bucket=bucket, Key=key)
    body, parts, total = resp["Body"], [], 0
    try:
        async for chunk in body.iter_chunks(CHUNK):
            total += len(chunk)
            check_size(key.rsplit("/", 1)[-1], total, cap)
            parts.append(chunk)
    finally:
        body.close()
    return b"".join(parts)


async def fetch_artifact(
    s3: S3Client,
    location: ObjectLocation,
    max_config_bytes: int,
    max_weights_bytes: int,
    policy: FetchPolicy | None = None,
) -> Artifact:
    """Read adapter_config.json and adapter_model.safetensors from the PEFT folder at location, each within
    its cap (at most the shared caps of lorafleet.adapter_rules.caps), under policy's deadline and retries."""
    policy = policy or FetchPolicy()
    what = f"fetch of {location.uri()}"
    try:
        return await fetch_with_retry(
            lambda: _fetch_once(s3, location, max_config_bytes, max_weights_bytes),
            policy,
            (TransientFetchError,),
            what,
        )
    except TimeoutError as exc:
        raise TransientFetchError(f"{what}: not done within {policy.deadline_s:g}s") from exc


async def _fetch_once(
    s3: S3Client, location: ObjectLocation, max_config_bytes: int, max_weights_bytes: int
) -> Artifact:
    try:
        listing = await _list(s3, location)
    except (ClientError, BotoCoreError) as exc:
        raise _classify(exc, "the adapter folder") from exc
    check_files(listing)
    for name, cap in ((ADAPTER_CONFIG_NAME, max_config_bytes), (ADAPTER_WEIGHTS_NAME, max_weights_bytes)):
        check_size(name, listing[name], cap)
    config_key, weights_key = artifact_keys(location.key)
    try:
        config = await _get(s3, location.bucket, config_key, max_config_bytes)
        weights = await _get(s3, location.bucket, weights_key, max_weights_bytes)
    except (ClientError, BotoCoreError) as exc:
        raise _classify(exc, "an adapter file") from exc
    except AdapterRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken stream (aiohttp's payload errors): try again
        raise TransientFetchError(f"object store stream broke reading an adapter file: {exc!r}") from exc
    return Artifact(config, weights)
