"""The tensors of a PEFT LoRA file against the base and the config: names, pairs, shapes and ranks.

Every tensor is `base_model.model.model.layers.N.<block>.<module>.lora_{A,B}.weight` for a linear the base
adapts (schemas.llama: module -> block); per module, lora_A is [rank, in_features] and lora_B is
[out_features, rank] for the base's shapes; a module's rank is at most the fleet cap and equals the rank the
config gives its path (r, or its rank_pattern entry); and the modules with tensors are exactly the ones the
config targets on this base (target_modules, exclude_modules, layers_to_transform). The adapter's rank is
its largest module rank: it picks the rank bucket, where smaller modules are zero-padded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lorafleet.adapter_rules.base_spec import ModelShapes
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.adapter_rules.patterns import matches_module
from lorafleet.adapter_rules.peft_config import AdapterConfig
from lorafleet.adapter_rules.safetensors_header import Header, TensorEntry
from schemas.llama import LLAMA_MODULES

ModuleKey = tuple[int, str]  # (decoder layer, module name)
KEY_RE = re.compile(
    r"base_model\.model\.model\.layers\.(0|[1-9][0-9]{0,5})\.(\w+)\.(\w+)\.lora_(A|B)\.weight", re.ASCII
)


def module_path(layer: int, module: str) -> str:
    """PEFT's path of a module inside a LlamaForCausalLM, the name its patterns match."""
    return f"model.layers.{layer}.{LLAMA_MODULES[module]}.{module}"


def tensor_name(layer: int, module: str, which: str) -> str:
    """The key PEFT's save_pretrained writes for lora_A or lora_B of one module."""
    return f"base_model.model.{module_path(layer, module)}.lora_{which}.weight"


def parse_lora_key(name: str) -> tuple[int, str, str, str] | None:
    """(layer, block, module, "A" or "B") of a PEFT LoRA key, or None for any other name."""
    m = KEY_RE.fullmatch(name)
    return (int(m[1]), m[2], m[3], m[4]) if m else None


@dataclass(frozen=True)
class ModulePlan:
    """One adapted linear: its lora_A [rank, in] and lora_B [out, rank] entries, rank and scale."""

    a: TensorEntry
    b: TensorEntry
    rank: int
    scale: float


@dataclass(frozen=True)
class AdapterPlan:
    """The checked adapter: every adapted module, in (layer, module) order, and the largest rank."""

    modules: dict[ModuleKey, ModulePlan]
    rank: int

    @property
    def module_names(self) -> frozenset[str]:
        return frozenset(name for _, name in self.modules)


def _unknown(why: str, param: str | None = None) -> AdapterRejected:
    return AdapterRejected(RejectCode.UNKNOWN_TARGET_MODULE, why, param)


def _pairs(header: Header) -> dict[ModuleKey, dict[str, TensorEntry]]:
    """Tensors grouped by module; every name must be a LoRA key of a Llama linear in its block."""
    pairs: dict[ModuleKey, dict[str, TensorEntry]] = {}
    for name, entry in header.tensors.items():
        shown = name[:200]
        key = parse_lora_key(name)
        if key is None:
            raise _unknown(f"tensor {shown!r} is not a PEFT LoRA key of a Llama linear", shown)
        layer, block, module, which = key
        if LLAMA_MODULES.get(module) != block:
            raise _unknown(f"tensor {shown!r} adapts {block}.{module}, not a Llama linear", shown)
        pairs.setdefault((layer, module), {})[which] = entry
    return pairs


def _pair_rank(key: ModuleKey, pair: dict[str, TensorEntry]) -> tuple[TensorEntry, TensorEntry, int]:
    """(lora_A, lora_B, rank) of a module whose two tensors are [r, in] and [out, r] with r >= 1."""
    where = f"layer {key[0]} {key[1]}"
    a, b = pair.get("A"), pair.get("B")
    if a is None or b is None:
        raise AdapterRejected(RejectCode.SHAPE_MISMATCH, f"{where}: lora_A and lora_B must both be present")
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
        raise AdapterRejected(
            RejectCode.SHAPE_MISMATCH,
            f"{where}: lora_A {list(a.shape)} / lora_B {list(b.shape)} are not [r, in] / [out, r]",
        )
    return a, b, a.shape[0]


def describe(header: Header) -> tuple[int, list[str]]:
    """(largest rank, adapted module names) from the tensors alone, without a base: what a registration
    says about these files. AdapterRejected when the names or pairs make them undescribable."""
    pairs = _pairs(header)
    ranks = [_pair_rank(key, pair)[2] for key, pair in sorted(pairs.items())]
    return max(ranks), sorted({module for _, module in pairs})


def _plan(
    key: ModuleKey, pair: dict[str, TensorEntry], config: AdapterConfig, spec: ModelShapes, max_rank: int
) -> ModulePlan:
    layer, module = key
    where = f"layer {layer} {module}"
    if module not in spec.shapes or layer >= spec.num_layers:
        raise _unknown(
            f"{where}: the base adapts {sorted(spec.shapes)} in layers 0..{spec.num_layers - 1}",
            tensor_name(layer, module, "A"),
        )
    a, b, rank = _pair_rank(key, pair)
    in_features, out_features = spec.shapes[module]
    if a.shape[1] != in_features or b.shape[0] != out_features:
        raise AdapterRejected(
            RejectCode.SHAPE_MISMATCH,
            f"{where}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit the base "
            f"[{out_features}, {in_features}]",
        )
    if rank > max_rank:
        raise AdapterRejected(
            RejectCode.RANK_OVER_CAP, f"{where}: rank {rank} exceeds the cap {max_rank}", "r"
        )
    path = module_path(layer, module)
    configured = config.rank_for(path)
    if rank != configured:
        raise AdapterRejected(
            RejectCode.CONFIG_RANK_MISMATCH,
            f"{where}: the tensors have rank {rank}, the config gives {path} rank {configured}",
            "rank_pattern" if config.rank_pattern else "r",
        )
    return ModulePlan(a, b, rank, config.scale(config.alpha_for(path), rank))


def targeted(config: AdapterConfig, num_layers: int) -> set[ModuleKey]:
    """The (layer, module) pairs PEFT would adapt on a Llama of num_layers layers."""
    paths = {(layer, m): module_path(layer, m) for layer in range(num_layers) for m in LLAMA_MODULES}
    if not isinstance(config.target_modules, str):
        for entry in config.target_modules:
            if not any(matches_module((entry,), p) for p in paths.values()):
                raise _unknown(f"target_modules names {entry[:80]!r}, not a Llama linear", "target_modules")
    return {key for key, path in paths.items() if config.targets(path)}


def check_tensors(header: Header, config: AdapterConfig, spec: ModelShapes, max_rank: int) -> AdapterPlan:
    """The plan of a header whose tensors fit the base, the cap and the config; AdapterRejected if not."""
    pairs = _pairs(header)
    modules = {key: _plan(key, pairs[key], config, spec, max_rank) for key in sorted(pairs)}
    want = targeted(config, spec.num_layers)
    if set(modules) != want:
        missing, extra = sorted(want - set(modules)), sorted(set(modules) - want)
        raise AdapterRejected(
            RejectCode.CONFIG_TARGET_MISMATCH,
            f"the config targets {len(want)} modules and the tensors adapt {len(modules)}: "
            f"without tensors {missing[:4]}, not targeted {extra[:4]}",
            "target_modules",
        )
    return AdapterPlan(modules, max(m.rank for m in modules.values()))
