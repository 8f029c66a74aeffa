"""Object-store tier: fetch an adapter's two files into the disk tier's staging folder, hashing as they land.

The weights must hash to the registered digest before they are committed to disk; otherwise the staging
folder is deleted and ChecksumMismatchError is raised, so bad bytes never reach any tier. Reads are capped
in bytes. s3:// URIs go through aioboto3 (lorafleet.s3); file:// URIs serve the single-machine default and
are read only under the roots this replica was configured with.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.errors import (
    AdapterCacheError,
    ArtifactTooLargeError,
    ChecksumMismatchError,
    UnsupportedUriError,
)
from replica.adapter_cache.record import AdapterRecord
from replica.lora.weights import CONFIG_NAME, WEIGHTS_NAME
from schemas.api import artifact_keys

log = logging.getLogger(__name__)

CHUNK = 8 << 20
MAX_CONFIG_BYTES = 1 << 20


class ObjectStore:
    """Reads PEFT folders named by weights_uri; `s3` is an open aioboto3 client (or None without S3)."""

    def __init__(
        self, s3: Any | None, file_roots: list[Path] | None = None, max_bytes: int = 4 << 30
    ) -> None:
        self.s3 = s3
        self.file_roots = [Path(r).resolve() for r in file_roots or []]
        self.max_bytes = max_bytes

    async def fetch(
        self, record: AdapterRecord, disk: DiskTier, pinned: bool = False
    ) -> tuple[str, list[str], int]:
        """Download, verify and commit; return (disk entry name, disk entries evicted, bytes fetched)."""
        staging = await asyncio.to_thread(disk.staging_dir)
        try:
            weights_digest, size = await self._copy(record.weights_uri, WEIGHTS_NAME, staging, self.max_bytes)
            if weights_digest != record.digest:
                raise ChecksumMismatchError(
                    f"adapter {record.adapter_id!r}: fetched weights do not match the registered checksum"
                )
            config_digest, config_size = await self._copy(
                record.weights_uri, CONFIG_NAME, staging, MAX_CONFIG_BYTES
            )
            name, evicted = await asyncio.to_thread(
                disk.commit, staging, weights_digest, config_digest, pinned
            )
            return name, evicted, size + config_size
        except BaseException:
            await asyncio.to_thread(disk.discard, staging)
            raise

    async def _copy(self, uri: str, filename: str, staging: Path, cap: int) -> tuple[str, int]:
        parsed = urlparse(uri)
        if parsed.scheme == "s3" and self.s3 is not None:
            return await self._copy_s3(
                parsed.netloc, parsed.path.lstrip("/"), filename, staging / filename, cap
            )
        if parsed.scheme == "file":
            return await asyncio.to_thread(
                self._copy_file, Path(parsed.path) / filename, staging / filename, cap
            )
        raise UnsupportedUriError(f"this replica cannot read weights_uri scheme {parsed.scheme!r}")

    async def _copy_s3(
        self, bucket: str, prefix: str, filename: str, dest: Path, cap: int
    ) -> tuple[str, int]:
        config_key, weights_key = artifact_keys(prefix)
        key = weights_key if filename == WEIGHTS_NAME else config_key
        try:
            resp = await self.s3.get_object(Bucket=bucket, Key=key)
        except Exception as exc:  # noqa: BLE001 - botocore raises many types; all mean "not fetched now"
            raise AdapterCacheError(f"object store GET failed for {filename}: {type(exc).__name__}") from exc
        if resp.get("ContentLength", 0) > cap:
            raise ArtifactTooLargeError(f"{filename} is {resp['ContentLength']} bytes, over the cap of {cap}")
        h, size = hashlib.sha256(), 0
        body = resp["Body"]
        with open(dest, "wb") as f:
            async with body:
                while chunk := await body.read(CHUNK):
                    size += len(chunk)
                    if size > cap:
                        raise ArtifactTooLargeError(f"{filename} is over the cap of {cap} bytes")
                    await asyncio.to_thread(_write_and_hash, f, h, chunk)
        return h.hexdigest(), size

    def _copy_file(self, src: Path, dest: Path, cap: int) -> tuple[str, int]:
        real = src.resolve()
        if not any(real.is_relative_to(root) for root in self.file_roots):
            raise UnsupportedUriError("file:// weights_uri outside the configured roots")
        if not real.is_file():
            raise AdapterCacheError(f"{src.name} is missing from the object store")
        if real.stat().st_size > cap:
            raise ArtifactTooLargeError(f"{src.name} is over the cap of {cap} bytes")
        h, size = hashlib.sha256(), 0
        with open(real, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(CHUNK):
                size += len(chunk)
                if size > cap:
                    raise ArtifactTooLargeError(f"{src.name} is over the cap of {cap} bytes")
                _write_and_hash(fout, h, chunk)
        return h.hexdigest(), size


def _write_and_hash(f: Any, h: Any, chunk: bytes) -> None:
    f.write(chunk)
    h.update(chunk)
