"""adapter_config.json: the PEFT LoRA fields the fleet serves, what they mean, and every other feature off.

Served, with PEFT's meaning (the installed peft package is the reference):
- `r` (default 8) and `lora_alpha` (default 8): a module's rank and alpha unless a pattern overrides them;
- `rank_pattern` / `alpha_pattern`: per-module overrides; the first key (in the file's order) that matches
  the module's path by PEFT's rule wins (patterns.pattern_key);
- `use_rslora`: the scale is alpha / sqrt(rank) instead of alpha / rank;
- `target_modules` (a list of names or dotted suffixes, a regex string, or "all-linear"), `exclude_modules`,
  `layers_to_transform` and `layers_pattern`: which linears carry the adapter;
- `base_model_hash` (a lorafleet field): the base the adapter was trained on.

Fields with no effect on a forward pass (task_type, lora_dropout, init configs, ...) are ignored. Features
that change the forward pass or the base weights (DoRA, LoRA biases, bias != "none", modules_to_save,
fan_in_fan_out, a base-rewriting init such as PiSSA or LoftQ, ...) must be off, and so must any field this
module does not know: a feature we do not serve is refused, never silently dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from lorafleet.adapter_rules import caps, strict_json
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.adapter_rules.patterns import (
    MAX_COMPLEX,
    check_pattern,
    first_match,
    is_complex,
    key_regex,
    layer_index,
    matches_module,
)
from schemas.api import ADAPTER_CONFIG_NAME as CONFIG_NAME
from schemas.llama import LLAMA_MODULES

MAX_PATTERNS = 1024  # entries per rank_pattern / alpha_pattern, and names per target list
ALL_LINEAR = "all-linear"

# Fields that change nothing in a served forward pass.
IGNORED = frozenset(
    {
        "task_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
        "lora_dropout", "megatron_core", "runtime_config", "qalora_group_size", "loftq_config", "eva_config",
        "corda_config", "lora_ga_config", "ensure_weight_tying",
    }
)  # fmt: skip
# init_lora_weights values that only initialise A and B; the others (pissa, olora, loftq, corda, lora_ga,
# mica) rewrite the base weights, so their adapters need a base the fleet does not serve.
PLAIN_INITS: tuple[object, ...] = (True, False, "gaussian", "eva", "orthogonal")


@dataclass(frozen=True)
class AdapterConfig:
    """The served meaning of one adapter_config.json."""

    r: int
    lora_alpha: float
    use_rslora: bool
    rank_pattern: tuple[tuple[str, re.Pattern[str], int], ...]  # (key, its rule, rank) in the file's order
    alpha_pattern: tuple[tuple[str, re.Pattern[str], float], ...]
    target_modules: str | tuple[str, ...]  # a regex (full match) or names / dotted suffixes
    exclude_modules: str | tuple[str, ...]
    layers_to_transform: tuple[int, ...] | None
    layers_pattern: tuple[str, ...]
    base_model_hash: str | None

    def rank_for(self, name: str) -> int:
        """The rank PEFT gives the module at this path: the first matching rank_pattern key's, else r."""
        rank = first_match(self.rank_pattern, name)
        return self.r if rank is None else rank

    def alpha_for(self, name: str) -> float:
        """The alpha PEFT gives the module at this path: the first matching alpha_pattern key's, else
        lora_alpha."""
        alpha = first_match(self.alpha_pattern, name)
        return self.lora_alpha if alpha is None else alpha

    def scale(self, alpha: float, rank: int) -> float:
        """alpha / sqrt(rank) under rsLoRA, else alpha / rank (PEFT's LoraLayer.scaling)."""
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    def targets(self, name: str) -> bool:
        """PEFT's rule for whether the module at this path carries the adapter."""
        if self.exclude_modules and matches_module(self.exclude_modules, name):
            return False
        if not matches_module(self.target_modules, name):
            return False
        if isinstance(self.target_modules, str) or not self.layers_to_transform:
            return True
        return layer_index(name, self.layers_pattern) in self.layers_to_transform


def _bad(field: str, why: str) -> AdapterRejected:
    return AdapterRejected(RejectCode.INVALID_ADAPTER_CONFIG, f"{CONFIG_NAME} field {field}: {why}", field)


def _unsupported(field: str, value: object, why: str) -> AdapterRejected:
    shown = repr(value)[:80]
    return AdapterRejected(
        RejectCode.UNSUPPORTED_ADAPTER_FEATURE, f"{CONFIG_NAME} field {field}={shown}: {why}", field
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _off(value: object) -> bool:
    """None, false, zero, "" or an empty list or object: the value every optional feature takes when off."""
    return value is None or value == "" or (isinstance(value, bool | int | float | list | dict) and not value)


# field -> why it must be off (its value None, false, "", [] or {}); bias is the one whose off value is "none"
MUST_BE_OFF: dict[str, str] = {
    "use_dora": "DoRA adapters are not served",
    "lora_bias": "LoRA biases are not served",
    "modules_to_save": "full-module copies are not served",
    "fan_in_fan_out": "fan_in_fan_out is for Conv1D models",
    "target_parameters": "LoRA on parameters is not served",
    "trainable_token_indices": "trainable tokens are not served",
    "layer_replication": "layer replication is not served",
    "use_qalora": "QA-LoRA is not served",
    "alora_invocation_tokens": "activated LoRA is not served",
    "megatron_config": "Megatron layers are not served",
    "arrow_config": "Arrow routing is not served",
    "velora_config": "VeLoRA is not served",
    "monteclora_config": "MonteCLoRA is not served",
    "kasa_config": "KaSA is not served",
    "use_bdlora": "BD-LoRA is not served",
}


def _check_features(raw: dict[str, Any]) -> None:
    if raw.get("peft_type", "LORA") != "LORA":
        raise _unsupported("peft_type", raw["peft_type"], "only LORA adapters are served")
    if raw.get("bias", "none") != "none":
        raise _unsupported("bias", raw["bias"], "only bias='none' is served")
    init = raw.get("init_lora_weights", True)
    if not any(init is p or (isinstance(p, str) and init == p) for p in PLAIN_INITS):
        raise _unsupported("init_lora_weights", init, "this init rewrites the base weights")
    for field, why in MUST_BE_OFF.items():
        if not _off(raw.get(field)):
            raise _unsupported(field, raw[field], why)
    known = IGNORED | MUST_BE_OFF.keys() | _SERVED | {"peft_type", "bias", "init_lora_weights"}
    for field in sorted(raw):
        if field not in known and not _off(raw[field]):
            raise _unsupported(field[:80], raw[field], "a feature this fleet does not know")


def _pattern_map(raw: dict[str, Any], field: str, value_ok: Any) -> list[tuple[str, Any]]:
    value = raw.get(field)
    if value is None:
        return []
    if not isinstance(value, dict):
        raise _bad(field, "must be an object")
    if len(value) > MAX_PATTERNS:
        raise _unsupported(field, f"{len(value)} entries", f"at most {MAX_PATTERNS} entries")
    out = []
    for key, v in value.items():
        check_pattern(key, field)
        if not value_ok(v):
            raise _bad(field, f"{key[:80]!r} maps to {v!r}")
        out.append((key, v))
    return out


def _modules(raw: dict[str, Any], field: str, required: bool) -> str | tuple[str, ...]:
    value = raw.get(field)
    if value is None or value == "" or value == []:
        if required:
            raise _bad(field, "names no module")
        return ()
    if isinstance(value, str):
        if field == "target_modules" and value.lower() == ALL_LINEAR:
            return tuple(LLAMA_MODULES)
        return check_pattern(value, field)
    if not isinstance(value, list) or len(value) > MAX_PATTERNS:
        raise _bad(field, f"must be a string or a list of at most {MAX_PATTERNS} names")
    if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in value):
        raise _bad(field, "must list module names")
    return tuple(value)


def _layers(raw: dict[str, Any], target_is_regex: bool) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    layers, pattern = raw.get("layers_to_transform"), raw.get("layers_pattern")
    if target_is_regex and (layers is not None or pattern is not None):
        raise _bad("layers_to_transform", "cannot be combined with a regex target_modules")
    if pattern not in (None, "", []) and layers is None:
        raise _bad("layers_pattern", "needs layers_to_transform")
    if layers is None or layers == []:
        parsed = None
    elif _is_int(layers) and layers >= 0:
        parsed = (layers,)
    elif (
        isinstance(layers, list)
        and len(layers) <= MAX_PATTERNS
        and all(_is_int(x) and x >= 0 for x in layers)
    ):
        parsed = tuple(layers)
    else:
        raise _bad("layers_to_transform", "must be a layer index or a list of them")
    names = [pattern] if isinstance(pattern, str) and pattern else pattern or []
    if not isinstance(names, list) or not all(
        isinstance(p, str) and p.isidentifier() and p.isascii() for p in names
    ):
        raise _bad("layers_pattern", "must be a module name or a list of them")
    return parsed, tuple(names)


_SERVED = frozenset(
    {
        "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules", "exclude_modules",
        "layers_to_transform", "layers_pattern", "base_model_hash",
    }
)  # fmt: skip


def parse_adapter_config(data: bytes) -> AdapterConfig:
    """adapter_config.json's bytes -> its served meaning; AdapterRejected for anything else."""
    caps.check_size(CONFIG_NAME, len(data), caps.MAX_CONFIG_BYTES)
    raw = strict_json.loads(data, RejectCode.INVALID_ADAPTER_CONFIG, CONFIG_NAME)
    if not isinstance(raw, dict):
        raise AdapterRejected(RejectCode.INVALID_ADAPTER_CONFIG, f"{CONFIG_NAME} must be a JSON object")
    r, alpha = raw.get("r", 8), raw.get("lora_alpha", 8)
    if not _is_int(r) or r < 1:
        raise _bad("r", f"{r!r} is not a positive integer")
    if not _is_number(alpha) or alpha <= 0:
        raise _bad("lora_alpha", f"{alpha!r} is not a positive number")
    if not isinstance(raw.get("use_rslora", False), bool):
        raise _bad("use_rslora", "must be true or false")
    base = raw.get("base_model_hash")
    if base is not None and not isinstance(base, str):
        raise _bad("base_model_hash", "must be a string")
    rank_pattern = _pattern_map(raw, "rank_pattern", lambda v: _is_int(v) and v >= 1)
    alpha_pattern = _pattern_map(raw, "alpha_pattern", lambda v: _is_number(v) and v > 0)
    target = _modules(raw, "target_modules", required=True)
    exclude = _modules(raw, "exclude_modules", required=False)
    layers, layers_pattern = _layers(raw, isinstance(raw.get("target_modules"), str))
    _check_features(raw)
    regexes = [k for k, _ in rank_pattern + alpha_pattern] + [
        p for p in (target, exclude) if isinstance(p, str)
    ]
    if sum(is_complex(p) for p in regexes) > MAX_COMPLEX:
        raise AdapterRejected(
            RejectCode.UNSUPPORTED_ADAPTER_FEATURE,
            f"{CONFIG_NAME}: more than {MAX_COMPLEX} patterns use a group, '|' or a repetition",
        )
    return AdapterConfig(
        r=r,
        lora_alpha=float(alpha),
        use_rslora=bool(raw.get("use_rslora", False)),
        rank_pattern=tuple((k, key_regex(k), v) for k, v in rank_pattern),
        alpha_pattern=tuple((k, key_regex(k), float(v)) for k, v in alpha_pattern),
        target_modules=target,
        exclude_modules=exclude,
        layers_to_transform=layers,
        layers_pattern=layers_pattern,
        base_model_hash=base,
    )
