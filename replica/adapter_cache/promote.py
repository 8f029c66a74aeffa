"""Disk -> RAM in one read: verify, validate and pack an adapter from a single buffer of its file.

The weights file is read once into one (pinned, when a GPU is present) byte buffer. Its sha256 runs on a
worker thread over that buffer while this thread parses the safetensors header and runs the same checks as
replica.lora.weights.read_adapter, each with its own error: a well-formed config we can serve, the base hash,
a well-formed safetensors header (no pickle is ever opened), known target modules, shapes and rank within the
cap, an allowed dtype, then ONE NaN/Inf check over the packed buffer. When every tensor already has the slot
dtype, the packed buffer is a view of the file's data section (zero copies); otherwise each tensor is copied
once, converting. A digest mismatch wins over any validation error: the caller drops the entry and fetches
again. Entry point: read_entry(...).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.host import HostAdapter, PackedModule
from replica.errors import (
    AdapterConfigError,
    AdapterNonFiniteError,
    AdapterNotSafetensorsError,
    AdapterTargetModuleError,
)
from replica.lora.spec import MODULE_PARENTS, AdapterSpec
from replica.lora.weights import (
    ALLOWED_DTYPES,
    CONFIG_NAME,
    MAX_WEIGHTS_BYTES,
    WEIGHTS_NAME,
    ModuleKey,
    alpha_for,
    check_base_hash,
    check_shapes,
    module_key,
    parse_config,
    weights_path,
)

# safetensors dtype name -> bytes per element (every dtype the format defines); torch dtypes we can serve
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
assert set(TORCH_DTYPES.values()) == ALLOWED_DTYPES
MAX_HEADER_BYTES = 100 << 20
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-sha256")


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: dtype name, shape, and its byte range [begin, end) in the whole buffer."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_entry(
    path: Path,
    weights_digest: str,
    config_digest: str,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
) -> tuple[HostAdapter, int]:
    """Read, verify, validate and pack one disk entry; return (host adapter, bytes read)."""
    wpath = weights_path(path)
    size = wpath.stat().st_size
    buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)  # [file bytes]
    view = memoryview(buf.numpy())
    try:
        with open(wpath, "rb", buffering=0) as f:
            got = f.readinto(view)
        config = (path / CONFIG_NAME).read_bytes()
    except OSError as exc:
        raise ChecksumMismatchError(f"local copy of {adapter_id!r} could not be read: {exc}") from exc
    hashing = _HASHER.submit(lambda: hashlib.sha256(view).hexdigest())
    try:
        host = _validate_and_pack(buf, config, adapter_id, base_model_hash, spec, dtype, pin, weights_digest)
    except BaseException:
        _check_digests(hashing.result(), weights_digest, config, config_digest, got, size)
        raise
    _check_digests(hashing.result(), weights_digest, config, config_digest, got, size)
    return host, size + len(config)


def _check_digests(weights: str, want: str, config: bytes, want_config: str, got: int, size: int) -> None:
    if got != size or weights != want or hashlib.sha256(config).hexdigest() != want_config:
        raise ChecksumMismatchError("local copy does not match its digest")


def parse_header(buf: torch.Tensor) -> tuple[dict[str, Entry], int]:
    """buf [file bytes] -> (tensor name -> Entry, start of the data section); AdapterNotSafetensorsError."""
    size = buf.numel()
    if size > MAX_WEIGHTS_BYTES:
        raise AdapterNotSafetensorsError(f"{WEIGHTS_NAME} is larger than {MAX_WEIGHTS_BYTES} bytes")
    if size < 8:
        raise _bad("shorter than its header length")
    (n,) = struct.unpack("<Q", bytes(buf[:8].numpy()))
    if n > min(size - 8, MAX_HEADER_BYTES):
        raise _bad(f"header length {n} does not fit the file")
    try:
        header = json.loads(bytes(buf[8 : 8 + n].numpy()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise _bad("header is not a JSON object")
    start, entries = 8 + n, {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        entries[key] = _entry(key, info, start, size)
    cursor = start  # the format's rule: tensors tile the data section, in order, without gaps
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin != cursor:
            raise _bad("tensor data overlaps or leaves gaps")
        cursor = e.end
    if cursor != size:
        raise _bad("data section does not match the tensors")
    return entries, start


def _entry(key: str, info: object, start: int, size: int) -> Entry:
    if not isinstance(info, dict):
        raise _bad(f"entry {key!r} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise _bad(f"entry {key!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(f"entry {key!r} has a bad shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise _bad(f"entry {key!r} has bad data_offsets")
    begin, end = start + offsets[0], start + offsets[1]
    if not start <= begin <= end <= size or end - begin != math.prod(shape) * ITEMSIZE[dtype]:
        raise _bad(f"entry {key!r} data_offsets do not match its shape or the file")
    return Entry(dtype, tuple(shape), begin, end)


def _bad(why: str) -> AdapterNotSafetensorsError:
    return AdapterNotSafetensorsError(f"{WEIGHTS_NAME} is not a valid safetensors file: {why}")


def _validate_and_pack(
    buf: torch.Tensor,
    config: bytes,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    digest: str,
) -> HostAdapter:
    raw = parse_config(config)
    check_base_hash(spec.base_model_hash, base_model_hash or raw.get("base_model_hash"))
    entries, start = parse_header(buf)
    pairs: dict[ModuleKey, dict[str, str]] = {}
    for key in entries:
        mkey, which = module_key(key, spec)
        pairs.setdefault(mkey, {})[which] = key
    if not pairs:
        raise AdapterTargetModuleError("the adapter has no LoRA tensors")
    for (layer, name), pair in pairs.items():
        check_shapes(layer, name, {w: entries[k].shape for w, k in pair.items()}, spec)
    for key in sorted(entries):
        if entries[key].dtype not in TORCH_DTYPES:
            raise AdapterConfigError(f"tensor {key} has dtype {entries[key].dtype}", param=key)
    # Zero copies when the file already holds the slot dtype, aligned: flat is the file's data section.
    itemsize = dtype.itemsize
    same = all(TORCH_DTYPES[e.dtype] == dtype and e.begin % itemsize == 0 for e in entries.values())
    same = same and start % itemsize == 0
    if same:
        flat = buf[start:].view(dtype)  # [numel] in the slot dtype, a view of the file buffer
        offset_of = {k: (e.begin - start) // itemsize for k, e in entries.items()}
    else:
        offset_of, cursor = {}, 0
        for k, e in sorted(entries.items(), key=lambda kv: kv[1].begin):
            offset_of[k], cursor = cursor, cursor + math.prod(e.shape)
        flat = torch.empty(cursor, dtype=dtype, pin_memory=pin)  # [numel]
    use_rslora = bool(raw.get("use_rslora", False))
    modules: list[PackedModule] = []
    scales: list[float] = []
    for (layer, name), pair in sorted(pairs.items()):
        a, b = entries[pair["A"]], entries[pair["B"]]
        rank = a.shape[0]
        modules.append(
            PackedModule((layer, name), rank, offset_of[pair["A"]], a.shape, offset_of[pair["B"]], b.shape)  # type: ignore[arg-type]
        )
        alpha = alpha_for(raw, f"model.layers.{layer}.{MODULE_PARENTS[name]}.{name}")
        scales.append(alpha / math.sqrt(rank) if use_rslora else alpha / rank)
    if not same:
        for k, e in entries.items():
            src = buf[e.begin : e.end].view(TORCH_DTYPES[e.dtype])  # [numel of k] in the file dtype
            flat[offset_of[k] : offset_of[k] + src.numel()].copy_(src)
    # max and min propagate NaN and carry +-Inf: two reductions, no bool [numel] temporary
    if not bool(torch.isfinite(torch.stack([flat.amax(), flat.amin()])).all()):
        _raise_non_finite(flat, entries, offset_of)
    scale_t = torch.tensor(scales, dtype=torch.float32)  # [num_modules]
    if pin:
        scale_t = scale_t.pin_memory()
    return HostAdapter(adapter_id, digest, max(m.rank for m in modules), flat, scale_t, tuple(modules))


def _raise_non_finite(flat: torch.Tensor, entries: dict[str, Entry], offset_of: dict[str, int]) -> None:
    """The error path only: name the first tensor holding NaN or Inf."""
    for key in sorted(entries):
        n = math.prod(entries[key].shape)
        if not bool(torch.isfinite(flat[offset_of[key] : offset_of[key] + n]).all()):
            raise AdapterNonFiniteError(f"tensor {key} holds NaN or Inf", param=key)
    raise AdapterNonFiniteError("the adapter holds NaN or Inf")
