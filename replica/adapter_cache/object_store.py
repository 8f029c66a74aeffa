"""Object-store tier: fetch an adapter's two files into memory, hashing the bytes as they stream in.

This is where bytes enter the machine, so this is where the sha256 is verified, once. The weights
stream into one preallocated buffer (pinned when a GPU is present), sized from the object's length and
capped; each piece is hashed on a worker thread as soon as it lands, so hashing overlaps the transfer and
no byte is read twice. Bytes that do not hash to the registered digest raise ChecksumMismatchError and
never reach any tier. s3:// URIs go through aioboto3 (lorafleet.s3) under a FetchPolicy (a total deadline,
bounded retries with jitter: lorafleet.fetch_retry); a download that fails transiently or runs past the
deadline raises ObjectStoreUnavailableError (503, retryable), a missing object a plain AdapterCacheError.
file:// URIs serve the single-machine default and are read only under the roots this replica was
configured with.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy
import torch
from botocore.exceptions import ClientError

from lorafleet.adapter_rules import caps
from lorafleet.fetch_retry import FetchPolicy, fetch_with_retry
from replica.adapter_cache.errors import (
    AdapterCacheError,
    ArtifactTooLargeError,
    ChecksumMismatchError,
    ObjectStoreUnavailableError,
    UnsupportedUriError,
)
from replica.adapter_cache.record import AdapterRecord
from replica.lora.weights import CONFIG_NAME, WEIGHTS_NAME
from schemas.api import artifact_keys

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20  # file:// reads
HASH_STEP = 1 << 20  # hash in pieces of at least this many bytes
RETRYABLE = (ObjectStoreUnavailableError,)
MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "404", "NotFound", "AccessDenied", "403"}
# One hashing thread: pieces of one buffer are hashed in order, beside the transfer of the next ones.
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-sha256")


@dataclass(frozen=True)
class Fetched:
    """An adapter's files in memory, verified: weights [file bytes] uint8 (pinned with a GPU) and config."""

    weights: torch.Tensor
    config: bytes
    weights_digest: str
    config_digest: str

    @property
    def nbytes(self) -> int:
        return self.weights.numel() + len(self.config)


class StreamHasher:
    """sha256 of a buffer that fills from the front: feed(filled) hashes the new bytes on the hash thread."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._h = hashlib.sha256()
        self._hashed = 0
        self._last: Future[None] | None = None

    def feed(self, filled: int, final: bool = False) -> None:
        if filled - self._hashed >= HASH_STEP or (final and filled > self._hashed):
            piece = self._view[self._hashed : filled]
            self._last = _HASHER.submit(self._h.update, piece)
            self._hashed = filled

    def hexdigest_sync(self, filled: int) -> str:
        self.feed(filled, final=True)
        if self._last is not None:
            self._last.result()
        return self._h.hexdigest()

    async def hexdigest(self, filled: int) -> str:
        self.feed(filled, final=True)
        if self._last is not None:
            await asyncio.wrap_future(self._last)
        return self._h.hexdigest()


def new_buffer(size: int, pin: bool) -> tuple[torch.Tensor, memoryview]:
    """buf [size] uint8 (pinned when asked) and a writable byte view of it.

    Unpinned buffers come from numpy, whose allocator reuses freed heap memory and asks for huge pages:
    a fresh torch.empty buffer of an adapter's size was faulted in page by page on every read, which
    about doubled a disk read in profiling (bench load's disk tier moves with it). Pinned buffers come
    from torch's caching host allocator, which reuses its blocks.
    """
    if pin:
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    else:
        buf = torch.from_numpy(numpy.empty(size, dtype=numpy.uint8))  # shares the array's memory
    return buf, buf.numpy().data.cast("B")  # ndarray.data: the array as a memoryview


class ObjectStore:
    """Reads PEFT folders named by weights_uri; `s3` is an open aioboto3 client (or None without S3)."""

    def __init__(
        self, s3: Any | None, file_roots: list[Path] | None = None, policy: FetchPolicy | None = None
    ) -> None:
        self.s3 = s3
        self.file_roots = [Path(r).resolve() for r in file_roots or []]
        self.policy = policy or FetchPolicy()

    async def fetch(self, record: AdapterRecord, pin: bool = False) -> Fetched:
        """Download both files into memory and verify the weights against the registered digest."""
        parsed = urlparse(record.weights_uri)
        if parsed.scheme == "s3" and self.s3 is not None:
            bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
            what = f"adapter {record.adapter_id!r} download"
            try:
                weights, digest, config = await fetch_with_retry(
                    lambda: self._get_both(bucket, prefix, pin), self.policy, RETRYABLE, what
                )
            except TimeoutError as exc:
                raise ObjectStoreUnavailableError(
                    f"{what}: the object store did not deliver it within {self.policy.deadline_s:g}s"
                ) from exc
        elif parsed.scheme == "file":
            root = Path(parsed.path)
            weights, digest = await asyncio.to_thread(self._read_file, root / WEIGHTS_NAME, pin)
            config = await asyncio.to_thread(self._read_small_file, root / CONFIG_NAME)
        else:
            raise UnsupportedUriError(f"this replica cannot read weights_uri scheme {parsed.scheme!r}")
        if digest != record.digest:
            raise ChecksumMismatchError(
                f"adapter {record.adapter_id!r}: fetched weights do not match the registered checksum"
            )
        return Fetched(weights, config, digest, hashlib.sha256(config).hexdigest())

    async def _get_both(self, bucket: str, prefix: str, pin: bool) -> tuple[torch.Tensor, str, bytes]:
        """One try at both files, side by side; the config's download ends with the weights'."""
        config_key, weights_key = artifact_keys(prefix)
        config_task = asyncio.ensure_future(self._get_s3_small(bucket, config_key, CONFIG_NAME))
        try:
            weights, digest = await self._get_s3(bucket, weights_key, WEIGHTS_NAME, pin)
            return weights, digest, await config_task
        finally:
            if not config_task.done():
                config_task.cancel()
                await asyncio.gather(config_task, return_exceptions=True)
            elif not config_task.cancelled():
                config_task.exception()  # retrieved: the weights' error is the one raised

    async def _open_s3(self, bucket: str, key: str, filename: str, cap: int) -> tuple[Any, int]:
        if self.s3 is None:  # fetch() sends s3:// here only with a client
            raise UnsupportedUriError("this replica has no object store client")
        try:
            resp = await self.s3.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            error = AdapterCacheError if code in MISSING_CODES else ObjectStoreUnavailableError
            raise error(f"object store GET failed for {filename}: {code or type(exc).__name__}") from exc
        except Exception as exc:  # noqa: BLE001 - botocore raises many types; all mean "not fetched now"
            raise ObjectStoreUnavailableError(
                f"object store GET failed for {filename}: {type(exc).__name__}"
            ) from exc
        length = int(resp.get("ContentLength", 0))
        if length > cap:
            resp["Body"].close()
            raise ArtifactTooLargeError(f"{filename} is {length} bytes, over the cap of {cap}")
        return resp["Body"], length

    async def _get_s3(self, bucket: str, key: str, filename: str, pin: bool) -> tuple[torch.Tensor, str]:
        body, length = await self._open_s3(bucket, key, filename, caps.MAX_WEIGHTS_BYTES)
        buf, view = new_buffer(length, pin)
        hasher, filled = StreamHasher(view), 0
        try:
            async with body:
                while filled < length:
                    n = await body.readinto(view[filled:])
                    if n == 0:
                        break
                    filled += n
                    hasher.feed(filled)
        except AdapterCacheError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken or stalled stream: not fetched now
            raise ObjectStoreUnavailableError(
                f"object store read failed for {filename}: {type(exc).__name__}"
            ) from exc
        digest = await hasher.hexdigest(filled)
        if filled != length:
            raise ObjectStoreUnavailableError(f"{filename}: the object store sent {filled} of {length} bytes")
        return buf, digest

    async def _get_s3_small(self, bucket: str, key: str, filename: str) -> bytes:
        cap = caps.MAX_CONFIG_BYTES
        body, _length = await self._open_s3(bucket, key, filename, cap)
        try:
            async with body:
                data = await body.read(cap + 1)
        except Exception as exc:  # noqa: BLE001 - a broken or stalled stream: not fetched now
            raise ObjectStoreUnavailableError(
                f"object store read failed for {filename}: {type(exc).__name__}"
            ) from exc
        if len(data) > cap:
            raise ArtifactTooLargeError(f"{filename} is over the cap of {cap} bytes")
        return data

    def _checked_path(self, src: Path, cap: int) -> Path:
        real = src.resolve()
        if not any(real.is_relative_to(root) for root in self.file_roots):
            raise UnsupportedUriError("file:// weights_uri outside the configured roots")
        if not real.is_file():
            raise AdapterCacheError(f"{src.name} is missing from the object store")
        if real.stat().st_size > cap:
            raise ArtifactTooLargeError(f"{src.name} is over the cap of {cap} bytes")
        return real

    def _read_file(self, src: Path, pin: bool) -> tuple[torch.Tensor, str]:
        real = self._checked_path(src, caps.MAX_WEIGHTS_BYTES)
        with open(real, "rb", buffering=0) as f:
            size = real.stat().st_size
            buf, view = new_buffer(size, pin)
            hasher, filled = StreamHasher(view), 0
            while filled < size:
                n = f.readinto(view[filled : filled + READ_CHUNK])
                if not n:
                    break
                filled += n
                hasher.feed(filled)
            digest = hasher.hexdigest_sync(filled)
            if filled != size or f.read(1):
                raise AdapterCacheError(f"{src.name} changed size while it was read")
        return buf, digest

    def _read_small_file(self, src: Path) -> bytes:
        real = self._checked_path(src, caps.MAX_CONFIG_BYTES)
        with open(real, "rb") as f:
            data = f.read(caps.MAX_CONFIG_BYTES + 1)
        if len(data) > caps.MAX_CONFIG_BYTES:
            raise ArtifactTooLargeError(f"{src.name} is over the cap of {caps.MAX_CONFIG_BYTES} bytes")
        return data
