"""Check an adapter's files from their bytes, before anything is loaded: the safetensors header is parsed
here (8-byte little-endian length + JSON), never by a deserialiser, and pickle is refused by its magic.

A registered adapter passes when: the config is a LoRA config we can serve with the registered alpha; every
tensor is a PEFT LoRA key `base_model.model.model.layers.N.<block>.<module>.lora_{A,B}.weight` of an F32,
F16 or BF16 dtype; offsets tile the data section exactly; lora_A is [r, in] and lora_B is [out, r] for the
served base's shapes; the largest r equals the registered rank and is within the cap; the adapted modules are
exactly the registered target_modules; and no value is NaN or Inf.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from gateway.base_spec import BaseSpec
from schemas.llama import LLAMA_MODULES

KEY_RE = re.compile(r"^base_model\.model\.model\.layers\.(\d{1,5})\.(\w+)\.(\w+)\.lora_(A|B)\.weight$")
# dtype -> (bytes per value, unsigned view, exponent mask: all ones means Inf or NaN)
DTYPES: dict[str, tuple[int, type, int]] = {
    "F32": (4, np.uint32, 0x7F800000),
    "F16": (2, np.uint16, 0x7C00),
    "BF16": (2, np.uint16, 0x7F80),
}
PICKLE_MAGICS = (b"\x80", b"PK\x03\x04")  # pickle protocol >= 2; torch.save's zip container


class ArtifactRejected(Exception):
    """The artifact fails a check; code is the version's reason_code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Expected:
    """What the registration declared, and the limits that apply."""

    rank: int
    alpha: float
    target_modules: frozenset[str]
    max_rank: int
    max_header_bytes: int
    max_tensors: int


def check_config(raw: bytes, expected: Expected) -> dict[str, Any]:
    """Parse adapter_config.json and refuse what the fleet does not serve."""
    try:
        cfg = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactRejected("invalid_adapter_config", f"adapter_config.json is not JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ArtifactRejected("invalid_adapter_config", "adapter_config.json must be an object")
    refusals = [
        (cfg.get("peft_type", "LORA") != "LORA", "peft_type must be LORA"),
        (bool(cfg.get("use_dora")), "DoRA adapters are not served"),
        (cfg.get("bias", "none") != "none", "bias must be 'none'"),
        (bool(cfg.get("modules_to_save")), "modules_to_save must be null"),
        (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out must be false"),
        (bool(cfg.get("use_rslora")), "rsLoRA scaling is not served"),
        (bool(cfg.get("alpha_pattern")), "alpha_pattern is not served"),
    ]
    for refused, why in refusals:
        if refused:
            raise ArtifactRejected("invalid_adapter_config", why)
    alpha = cfg.get("lora_alpha")
    if not isinstance(alpha, int | float) or float(alpha) != float(expected.alpha):
        raise ArtifactRejected(
            "adapter_config_mismatch",
            f"lora_alpha {alpha!r} differs from the registered alpha {expected.alpha}",
        )
    return cfg


def read_header(blob: bytes, max_header_bytes: int) -> tuple[dict[str, Any], int]:
    """(header dict, data start offset) of a safetensors file; ArtifactRejected on any malformation."""
    if blob.startswith(PICKLE_MAGICS):
        raise ArtifactRejected("unsupported_format", "weights are a pickle/zip file, not safetensors")
    if len(blob) < 8:
        raise ArtifactRejected("invalid_safetensors", "file is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > max_header_bytes or 8 + n > len(blob):
        raise ArtifactRejected("invalid_safetensors", f"header length {n} exceeds the cap or the file")
    try:
        header = json.loads(blob[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactRejected("invalid_safetensors", f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ArtifactRejected("invalid_safetensors", "header must be a JSON object")
    return header, 8 + n


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # relative to the data section
    end: int


def tensor_table(header: dict[str, Any], data_len: int, max_tensors: int) -> list[TensorInfo]:
    """Validate every entry and that offsets tile [0, data_len) exactly, with no gap or overlap."""
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if not entries or len(entries) > max_tensors:
        raise ArtifactRejected("invalid_safetensors", f"{len(entries)} tensors (want 1..{max_tensors})")
    table = []
    for name, info in entries.items():
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            ok = all(isinstance(d, int) and d >= 0 for d in (*shape, start, end))
        except (TypeError, KeyError, ValueError) as exc:
            raise ArtifactRejected("invalid_safetensors", f"tensor {name!r}: malformed entry") from exc
        if dtype not in DTYPES:
            raise ArtifactRejected("invalid_safetensors", f"tensor {name!r}: dtype {dtype!r} not allowed")
        if not ok or end - start != prod(shape) * DTYPES[dtype][0]:
            raise ArtifactRejected("invalid_safetensors", f"tensor {name!r}: offsets do not match its shape")
        table.append(TensorInfo(name, dtype, shape, start, end))
    table.sort(key=lambda t: (t.start, t.end))
    cursor = 0
    for t in table:
        if t.start != cursor:
            raise ArtifactRejected("invalid_safetensors", "tensor offsets overlap or leave gaps")
        cursor = t.end
    if cursor != data_len:
        raise ArtifactRejected("invalid_safetensors", f"data is {data_len} bytes, tensors cover {cursor}")
    return table


def check_lora_tensors(table: list[TensorInfo], spec: BaseSpec, expected: Expected) -> int:
    """Check names and shapes against the served base; return the adapter's rank (largest r)."""
    pairs: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for t in table:
        m = KEY_RE.match(t.name)
        if not m:
            raise ArtifactRejected("unknown_target_module", f"tensor {t.name[:200]!r} is not a LoRA key")
        layer, block, module, which = int(m[1]), m[2], m[3], m[4]
        if LLAMA_MODULES.get(module) != block or layer >= spec.num_layers:
            raise ArtifactRejected("unknown_target_module", f"tensor {t.name[:200]!r} adapts no linear")
        pairs.setdefault((layer, module), {})[which] = t.shape
    ranks = []
    for (layer, module), pair in sorted(pairs.items()):
        a, b = pair.get("A"), pair.get("B")
        in_f, out_f = spec.shapes[module]
        if a is None or b is None or len(a) != 2 or len(b) != 2 or a[0] != b[1] or a[0] < 1:
            raise ArtifactRejected("shape_mismatch", f"layer {layer} {module}: lora_A {a} / lora_B {b}")
        if a[1] != in_f or b[0] != out_f:
            raise ArtifactRejected(
                "shape_mismatch",
                f"layer {layer} {module}: lora_A {a} / lora_B {b} do not fit [{out_f}, {in_f}]",
            )
        ranks.append(a[0])
    rank = max(ranks)
    if rank > expected.max_rank:
        raise ArtifactRejected("adapter_rank_exceeds_limit", f"rank {rank} exceeds {expected.max_rank}")
    if rank != expected.rank:
        raise ArtifactRejected("rank_mismatch", f"tensors have rank {rank}, registered {expected.rank}")
    modules = {module for _, module in pairs}
    if modules != expected.target_modules:
        raise ArtifactRejected(
            "target_modules_mismatch",
            f"tensors adapt {sorted(modules)}, registered {sorted(expected.target_modules)}",
        )
    return rank


def check_finite(data: memoryview, table: list[TensorInfo]) -> None:
    """Refuse NaN or Inf by bit pattern (exponent all ones), so bf16 needs no float conversion."""
    for t in table:
        _, view, mask = DTYPES[t.dtype]
        bits = np.frombuffer(data[t.start : t.end], dtype=view)
        if np.any((bits & view(mask)) == view(mask)):
            raise ArtifactRejected("non_finite_weights", f"tensor {t.name!r} holds NaN or Inf")


def check_weights(blob: bytes, spec: BaseSpec, expected: Expected) -> int:
    """Run every weights check on the file's bytes; return the adapter's rank."""
    header, data_start = read_header(blob, expected.max_header_bytes)
    table = tensor_table(header, len(blob) - data_start, expected.max_tensors)
    rank = check_lora_tensors(table, spec, expected)
    check_finite(memoryview(blob)[data_start:], table)
    return rank
