"""The header of adapter_model.safetensors, parsed from the file's bytes without any library, never unpickled.

The format: an 8-byte little-endian length n, then n bytes of a JSON object (it starts with `{`), then the
data section. Each entry names a tensor: {"dtype", "shape", "data_offsets": [begin, end]} with offsets
relative to the data section; "__metadata__" is an optional string -> string map. parse_header holds the
file to the format and to bounds an adapter never needs more than: the header is at most MAX_HEADER_BYTES
and strict JSON (strict_json), at most MAX_TENSORS tensors of at most MAX_DIMS dimensions, each in a served
dtype (F32, F16, BF16), its byte range exactly its shape's size, and the ranges tile the data section to the
file's last byte, without gap or overlap. Nothing is allocated beyond a copy of the header bytes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from lorafleet.adapter_rules import strict_json
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from schemas.api import ADAPTER_WEIGHTS_NAME as WEIGHTS_NAME

MAX_HEADER_BYTES = 4 << 20
MAX_TENSORS = 4096
MAX_DIMS = 8
# served dtype -> bytes per value
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
# every dtype the format defines: the others are valid safetensors the fleet does not serve
FORMAT_DTYPES = frozenset(
    {
        "BOOL",
        "U8",
        "I8",
        "F8_E4M3",
        "F8_E5M2",
        "I16",
        "U16",
        "F16",
        "BF16",
        "I32",
        "U32",
        "F32",
        "I64",
        "U64",
        "F64",
    }
)
PICKLE_MAGICS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")  # pickle >= 2; torch zip


@dataclass(frozen=True)
class TensorEntry:
    """One tensor: its served dtype, its shape, and its byte range [begin, end) in the whole file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """The parsed header: tensors by name (in the file's order) and where the data section starts."""

    tensors: dict[str, TensorEntry]
    data_start: int


def _bad(why: str, param: str | None = None) -> AdapterRejected:
    return AdapterRejected(
        RejectCode.INVALID_SAFETENSORS, f"{WEIGHTS_NAME} is not valid safetensors: {why}", param
    )


def _not_safetensors(head: bytes, why: str) -> AdapterRejected:
    if head.startswith(PICKLE_MAGICS):
        return AdapterRejected(
            RejectCode.UNSUPPORTED_FORMAT, f"{WEIGHTS_NAME} is a pickle or zip file, not safetensors"
        )
    return _bad(why)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(name: str, info: Any, data_start: int, data_len: int) -> TensorEntry:
    shown = name[:200]
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _bad(f"entry {shown!r} is not {{dtype, shape, data_offsets}}", shown)
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPE_BYTES:
        if isinstance(dtype, str) and dtype in FORMAT_DTYPES:
            raise AdapterRejected(
                RejectCode.UNSUPPORTED_DTYPE,
                f"tensor {shown!r} is {dtype}; served dtypes are F32, F16, BF16",
                shown,
            )
        raise _bad(f"entry {shown!r} has dtype {str(dtype)[:40]!r}", shown)
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise _bad(f"entry {shown!r} has a bad shape", shown)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise _bad(f"entry {shown!r} has bad data_offsets", shown)
    begin, end = offsets
    if not begin <= end <= data_len or end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise _bad(f"entry {shown!r}: data_offsets {offsets} do not match its shape or the file", shown)
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)


def parse_header(data: bytes | bytearray | memoryview) -> Header:
    """The whole file's bytes -> its header; AdapterRejected (invalid_safetensors, unsupported_format or
    unsupported_dtype) for any breach."""
    view = memoryview(data).cast("B")
    size = len(view)
    lead = bytes(view[:8])
    if size < 8:
        raise _not_safetensors(lead, "shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", lead)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise _not_safetensors(lead, f"a header length of {n} bytes does not fit the file or the cap")
    raw = bytes(view[8 : 8 + n])
    if not raw.startswith(b"{"):
        raise _not_safetensors(lead, "the header is not a JSON object")
    header = strict_json.loads(raw, RejectCode.INVALID_SAFETENSORS, "the safetensors header")
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _bad("__metadata__ is not a string -> string map")
    if not 1 <= len(header) <= MAX_TENSORS:
        raise _bad(f"{len(header)} tensors (an adapter has 1 to {MAX_TENSORS})")
    data_start, data_len = 8 + n, size - 8 - n
    tensors = {name: _entry(name, info, data_start, data_len) for name, info in header.items()}
    cursor = data_start  # the ranges tile the data section, in order, without gaps
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != cursor:
            raise _bad("tensor data overlaps or leaves gaps")
        cursor = t.end
    if cursor != size:
        raise _bad(f"the data section is {data_len} bytes, the tensors cover {cursor - data_start}")
    return Header(tensors, data_start)
