"""Read a PEFT LoRA directory and validate it against the served base; nothing is returned half-checked.

Checks, each with its own error: safetensors only (pickle files are refused, never opened), a well-formed
adapter_config.json we can serve, base_model_hash equal to the served base, keys naming known target modules,
rank from the tensor shapes within the cap, shapes matching the base, no NaN or Inf.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from replica.errors import (
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterNonFiniteError,
    AdapterNotSafetensorsError,
    AdapterRankTooLargeError,
    AdapterShapeError,
    AdapterTargetModuleError,
)
from replica.lora.row_layout import ModuleKey
from replica.lora.spec import MODULE_PARENTS, AdapterSpec

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_WEIGHTS_BYTES = 4 << 30
ALLOWED_DTYPES = {torch.float32, torch.float16, torch.bfloat16}
KEY_RE = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(\w+)\.(\w+)\.lora_(A|B)\.weight$")


@dataclass(frozen=True)
class ModuleLora:
    """One adapted linear: a [rank, in_features], b [out_features, rank], and its scale."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class AdapterWeights:
    """A validated adapter in host memory, keyed by its stable id (never by its path)."""

    adapter_id: str
    base_model_hash: str
    modules: dict[ModuleKey, ModuleLora]

    @property
    def rank(self) -> int:
        """The largest rank over the adapted modules; it picks the rank bucket."""
        return max(m.rank for m in self.modules.values())

    @property
    def nbytes(self) -> int:
        return sum(m.a.nbytes + m.b.nbytes for m in self.modules.values())


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = (path / CONFIG_NAME).read_bytes()
    except FileNotFoundError as exc:
        raise AdapterConfigError(f"{CONFIG_NAME} is missing", param=CONFIG_NAME) from exc
    except OSError as exc:
        raise AdapterConfigError(f"{CONFIG_NAME} is not valid JSON: {exc}", param=CONFIG_NAME) from exc
    return parse_config(data)


def parse_config(data: bytes) -> dict[str, Any]:
    """adapter_config.json's bytes -> its fields, refused (AdapterConfigError) unless we can serve them."""
    try:
        raw = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterConfigError(f"{CONFIG_NAME} is not valid JSON: {exc}", param=CONFIG_NAME) from exc
    if not isinstance(raw, dict):
        raise AdapterConfigError(f"{CONFIG_NAME} must be a JSON object", param=CONFIG_NAME)
    checks: list[tuple[str, bool, str]] = [
        ("peft_type", raw.get("peft_type", "LORA") == "LORA", "only LORA adapters are served"),
        (
            "lora_alpha",
            isinstance(raw.get("lora_alpha"), int | float) and raw["lora_alpha"] > 0,
            "must be > 0",
        ),
        ("r", isinstance(raw.get("r", 8), int) and raw.get("r", 8) > 0, "must be a positive integer"),
        ("use_dora", not raw.get("use_dora", False), "DoRA adapters are not served"),
        ("bias", raw.get("bias", "none") == "none", "only bias='none' is served"),
        ("modules_to_save", not raw.get("modules_to_save"), "full-module copies are not served"),
        ("fan_in_fan_out", not raw.get("fan_in_fan_out", False), "fan_in_fan_out is for Conv1D models"),
    ]
    for field, ok, why in checks:
        if not ok:
            raise AdapterConfigError(
                f"adapter_config.json field {field}={raw.get(field)!r}: {why}", param=field
            )
    return raw


def alpha_for(raw: dict[str, Any], name: str) -> float:
    """lora_alpha, or the alpha_pattern entry matching this module's full name (PEFT's suffix rule)."""
    for pattern, alpha in (raw.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", name):
            return float(alpha)
    return float(raw["lora_alpha"])


def check_base_hash(served: str, declared: str | None) -> None:
    if not declared:
        raise AdapterBaseMismatchError("the adapter does not declare the base_model_hash it was trained on")
    if declared != served:
        raise AdapterBaseMismatchError(f"adapter trained on base {declared}, this replica serves {served}")


def weights_path(path: Path) -> Path:
    pickles = sorted(p.name for p in path.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise AdapterNotSafetensorsError(f"pickle weight files are refused: {pickles}", param=WEIGHTS_NAME)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise AdapterNotSafetensorsError(f"{WEIGHTS_NAME} is missing", param=WEIGHTS_NAME)
    if weights.stat().st_size > MAX_WEIGHTS_BYTES:
        raise AdapterNotSafetensorsError(f"{WEIGHTS_NAME} is larger than {MAX_WEIGHTS_BYTES} bytes")
    return weights


def module_key(key: str, spec: AdapterSpec) -> tuple[ModuleKey, str]:
    m = KEY_RE.match(key)
    if not m:
        raise AdapterTargetModuleError(f"tensor {key!r} does not adapt a known Llama linear", param=key)
    layer, parent, name, which = int(m[1]), m[2], m[3], m[4]
    if name not in spec.shapes or MODULE_PARENTS.get(name) != parent or layer >= spec.num_layers:
        raise AdapterTargetModuleError(
            f"tensor {key!r} targets {parent}.{name} in layer {layer}; this replica adapts "
            f"{sorted(spec.shapes)} in layers 0..{spec.num_layers - 1}",
            param=key,
        )
    return (layer, name), which


def read_adapter(
    path: Path, adapter_id: str, spec: AdapterSpec, base_model_hash: str | None = None
) -> AdapterWeights:
    """Validate the PEFT directory at path and return its weights; raise an AdapterError subclass otherwise.

    base_model_hash is the hash the adapter was trained on, from its registration; when None, the
    `base_model_hash` field of adapter_config.json is used.
    """
    path = Path(path)
    if not path.is_dir():
        raise AdapterConfigError(f"adapter directory for {adapter_id!r} does not exist")
    weights_file = weights_path(path)
    raw = _read_config(path)
    check_base_hash(spec.base_model_hash, base_model_hash or raw.get("base_model_hash"))
    try:
        handle = safe_open(str(weights_file), framework="pt", device="cpu")
    except Exception as exc:  # the safetensors parser reports every malformed header this way
        raise AdapterNotSafetensorsError(f"{WEIGHTS_NAME} is not a valid safetensors file: {exc}") from exc
    with handle as f:
        shapes: dict[ModuleKey, dict[str, tuple[int, ...]]] = {}
        for key in f.keys():
            mkey, which = module_key(key, spec)
            shapes.setdefault(mkey, {})[which] = tuple(f.get_slice(key).get_shape())
        if not shapes:
            raise AdapterTargetModuleError("the adapter has no LoRA tensors")
        for (layer, name), pair in shapes.items():
            check_shapes(layer, name, pair, spec)
        modules: dict[ModuleKey, ModuleLora] = {}
        use_rslora = bool(raw.get("use_rslora", False))
        for (layer, name), _ in sorted(shapes.items()):
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"
            a, b = f.get_tensor(f"{prefix}.lora_A.weight"), f.get_tensor(f"{prefix}.lora_B.weight")
            for key, t in ((f"{prefix}.lora_A.weight", a), (f"{prefix}.lora_B.weight", b)):
                if t.dtype not in ALLOWED_DTYPES:
                    raise AdapterConfigError(f"tensor {key} has dtype {t.dtype}", param=key)
                if not torch.isfinite(t).all():
                    raise AdapterNonFiniteError(f"tensor {key} holds NaN or Inf", param=key)
            alpha, rank = alpha_for(raw, f"model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"), a.shape[0]
            scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
            modules[(layer, name)] = ModuleLora(a.contiguous(), b.contiguous(), scale)
    return AdapterWeights(adapter_id, spec.base_model_hash, modules)


def check_shapes(layer: int, name: str, pair: dict[str, tuple[int, ...]], spec: AdapterSpec) -> None:
    where = f"layer {layer} {name}"
    if set(pair) != {"A", "B"}:
        raise AdapterShapeError(f"{where}: lora_A and lora_B must both be present")
    a, b = pair["A"], pair["B"]
    if len(a) != 2 or len(b) != 2 or a[0] != b[1] or a[0] < 1:
        raise AdapterShapeError(f"{where}: lora_A {a} and lora_B {b} are not [r, in] and [out, r]")
    if a[0] > spec.max_rank:
        raise AdapterRankTooLargeError(f"{where}: rank {a[0]} exceeds the cap {spec.max_rank}", param="r")
    in_features, out_features = spec.shapes[name]
    if a[1] != in_features or b[0] != out_features:
        raise AdapterShapeError(
            f"{where}: lora_A {a} / lora_B {b} do not fit the base [{out_features}, {in_features}]"
        )
