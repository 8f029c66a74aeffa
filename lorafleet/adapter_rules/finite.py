"""NaN and Inf found by bit pattern: a value whose exponent bits are all ones, in any served dtype."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.adapter_rules.safetensors_header import TensorEntry

# served dtype -> (unsigned view of one value, exponent mask)
_BITS: dict[str, tuple[type[np.unsignedinteger], int]] = {
    "F32": (np.uint32, 0x7F800000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
}


def first_non_finite(data: bytes | bytearray | memoryview, tensors: Iterable[TensorEntry]) -> str | None:
    """The name of the first tensor (in the given order) holding NaN or Inf, or None."""
    view = memoryview(data).cast("B")
    for t in tensors:
        kind, mask = _BITS[t.dtype]
        bits = np.frombuffer(view[t.begin : t.end], dtype=kind)
        if np.any((bits & kind(mask)) == kind(mask)):
            return t.name
    return None


def check_finite(data: bytes | bytearray | memoryview, tensors: Iterable[TensorEntry]) -> None:
    """AdapterRejected(non_finite_weights) naming the first tensor that holds NaN or Inf."""
    name = first_non_finite(data, tensors)
    if name is not None:
        raise AdapterRejected(
            RejectCode.NON_FINITE_WEIGHTS, f"tensor {name[:200]} holds NaN or Inf", name[:200]
        )
