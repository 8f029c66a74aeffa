"""The safetensors header of an adapter file held in one buffer: parsed without any library, never unpickled.

parse_header() applies the format's rules (length prefix, JSON object, known dtypes, shapes matching the
byte ranges, tensors tiling the data section) and raises AdapterNotSafetensorsError for any breach.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch

from replica.errors import AdapterNotSafetensorsError
from replica.lora.weights import ALLOWED_DTYPES, MAX_WEIGHTS_BYTES, WEIGHTS_NAME

# safetensors dtype name -> bytes per element (every dtype the format defines); torch dtypes we can serve
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
assert set(TORCH_DTYPES.values()) == ALLOWED_DTYPES
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: dtype name, shape, and its byte range [begin, end) in the whole buffer."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


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
