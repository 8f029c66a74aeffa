"""base_model_hash: sha256 over a checkpoint's tensors in a canonical order, independent of shard layout.

For every tensor, in sorted name order across all *.safetensors shards, the digest takes
    name, NUL, dtype, NUL, shape as comma-separated ints, NUL, raw little-endian bytes
so resharding, reordering or changing file metadata leaves the hash unchanged, and any value change
moves it. Tensors are streamed from disk in chunks; a 7B checkpoint is never held in memory.
The result is cached in a small file in the directory, keyed by each shard's name, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

from lorafleet.model.errors import BaseModelError

log = logging.getLogger(__name__)

CACHE_FILE = ".base_model_hash.json"
CHUNK_BYTES = 16 << 20
HASH_PREFIX = "sha256:"


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes live inside a shard."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    start: int  # absolute byte offset in the file
    end: int


def base_model_hash(model_dir: Path) -> str:
    """Return "sha256:<64 hex>" for the checkpoint in model_dir, using the cache when shards are unchanged."""
    model_dir = Path(model_dir)
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise BaseModelError(f"no *.safetensors in {model_dir}; cannot compute base_model_hash")
    key = shard_fingerprint(shards)
    cached = read_cache(model_dir / CACHE_FILE, key)
    if cached is not None:
        return cached
    digest = hash_tensors(read_entries(shards))
    write_cache(model_dir / CACHE_FILE, key, digest)
    return digest


def shard_fingerprint(shards: list[Path]) -> dict[str, list[int]]:
    """Name -> [size, mtime_ns] for every shard; any rewrite changes it."""
    out: dict[str, list[int]] = {}
    for path in shards:
        stat = path.stat()
        out[path.name] = [stat.st_size, stat.st_mtime_ns]
    return out


def read_entries(shards: list[Path]) -> list[TensorEntry]:
    """Parse every shard's header and return its tensors sorted by name."""
    entries: dict[str, TensorEntry] = {}
    for path in shards:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        data_start = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in entries:
                raise BaseModelError(f"tensor {name!r} appears in two shards ({entries[name].path.name})")
            begin, end = info["data_offsets"]
            entries[name] = TensorEntry(
                name, info["dtype"], tuple(info["shape"]), path, data_start + begin, data_start + end
            )
    return [entries[name] for name in sorted(entries)]


def hash_tensors(entries: list[TensorEntry]) -> str:
    """Stream each tensor's header line and bytes into one sha256."""
    h = hashlib.sha256()
    for entry in entries:
        shape = ",".join(str(d) for d in entry.shape)
        h.update(f"{entry.name}\0{entry.dtype}\0{shape}\0".encode())
        with entry.path.open("rb") as f:
            f.seek(entry.start)
            remaining = entry.end - entry.start
            while remaining > 0:
                chunk = f.read(min(CHUNK_BYTES, remaining))
                if not chunk:
                    raise BaseModelError(f"{entry.path} is truncated inside tensor {entry.name!r}")
                h.update(chunk)
                remaining -= len(chunk)
    return HASH_PREFIX + h.hexdigest()


def read_cache(path: Path, key: dict[str, list[int]]) -> str | None:
    """Return the cached hash when the shards' fingerprint matches, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("shards") != key or not str(data.get("hash", "")).startswith(HASH_PREFIX):
        return None
    return str(data["hash"])


def write_cache(path: Path, key: dict[str, list[int]], digest: str) -> None:
    """Store the hash beside the shards; a read-only directory just goes uncached."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps({"shards": key, "hash": digest}))
        tmp.replace(path)
    except OSError as exc:
        log.debug("cannot cache base_model_hash in %s: %s", path.parent, exc)
