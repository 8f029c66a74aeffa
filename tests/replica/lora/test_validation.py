"""Every bad adapter is rejected with its own error before it takes a slot, and nothing is half-loaded.

A replica brings adapters in through its adapter cache (fetch, validation and packing, then the slot write)
and a merged replica reads its one adapter with read_adapter (AdapterRegistry.read); both refuse each case.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorafleet.adapter_rules.errors import RejectCode
from replica.errors import (
    RULE_ERRORS,
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterError,
    AdapterNonFiniteError,
    AdapterNotFoundError,
    AdapterNotSafetensorsError,
    AdapterRankTooLargeError,
    AdapterShapeError,
    AdapterTargetModuleError,
)
from replica.lora.registry import AdapterRegistry
from replica.lora.spec import AdapterSpec
from tests.replica.cache_util import local_cache
from tests.replica.peft_util import TEST_BASE_HASH, AdapterRecipe, build_lora_model, make_peft_adapters

WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture(scope="module")
def good_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, dirs = make_peft_adapters(
        tiny_model_dir, tmp_path_factory.mktemp("ad"), [AdapterRecipe("good", 8, 16)]
    )
    return dirs["good"]


def _edit_tensors(fn: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        tensors = load_file(d / WEIGHTS)
        fn(tensors)
        save_file(tensors, d / WEIGHTS)

    return edit


def _edit_config(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        raw = json.loads((d / "adapter_config.json").read_text())
        fn(raw)
        (d / "adapter_config.json").write_text(json.dumps(raw))

    return edit


def _nan(t: dict[str, torch.Tensor]) -> None:
    t[Q_A][0, 0] = float("nan")


def _drop_module(t: dict[str, torch.Tensor]) -> None:
    t.pop(Q_A)
    t.pop(Q_A.replace("lora_A", "lora_B"))


# case -> (edit, the load error, the shared rule's code it carries)
CASES: dict[str, tuple[Callable[[Path], None], type[AdapterError], RejectCode]] = {
    "pickle_beside": (
        lambda d: (d / "adapter_model.bin").write_bytes(b"\x80\x04."),
        AdapterNotSafetensorsError,
        RejectCode.UNSUPPORTED_FORMAT,
    ),
    "no_safetensors": (
        lambda d: (d / WEIGHTS).unlink(),
        AdapterNotSafetensorsError,
        RejectCode.ARTIFACT_MISSING,
    ),
    "garbage_safetensors": (
        lambda d: (d / WEIGHTS).write_bytes(b"\xff" * 64),
        AdapterNotSafetensorsError,
        RejectCode.INVALID_SAFETENSORS,
    ),
    "empty_safetensors": (
        lambda d: (d / WEIGHTS).write_bytes(b""),
        AdapterNotSafetensorsError,
        RejectCode.INVALID_SAFETENSORS,
    ),
    "bad_json": (
        lambda d: (d / "adapter_config.json").write_text("{not json"),
        AdapterConfigError,
        RejectCode.INVALID_ADAPTER_CONFIG,
    ),
    "dora": (
        _edit_config(lambda c: c.update(use_dora=True)),
        AdapterConfigError,
        RejectCode.UNSUPPORTED_ADAPTER_FEATURE,
    ),
    "modules_to_save": (
        _edit_config(lambda c: c.update(modules_to_save=["lm_head"])),
        AdapterConfigError,
        RejectCode.UNSUPPORTED_ADAPTER_FEATURE,
    ),
    "config_rank": (
        _edit_config(lambda c: c.update(r=4)),
        AdapterConfigError,
        RejectCode.CONFIG_RANK_MISMATCH,
    ),
    "untargeted_module": (_edit_tensors(_drop_module), AdapterConfigError, RejectCode.CONFIG_TARGET_MISMATCH),
    "other_base": (
        _edit_config(lambda c: c.update(base_model_hash="sha256:" + "00" * 32)),
        AdapterBaseMismatchError,
        RejectCode.BASE_MODEL_MISMATCH,
    ),
    "no_base_hash": (
        _edit_config(lambda c: c.pop("base_model_hash")),
        AdapterBaseMismatchError,
        RejectCode.BASE_MODEL_MISMATCH,
    ),
    "lm_head_target": (
        _edit_tensors(lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 64)})),
        AdapterTargetModuleError,
        RejectCode.UNKNOWN_TARGET_MODULE,
    ),
    "layer_out_of_range": (
        _edit_tensors(lambda t: t.update({Q_A.replace("layers.0", "layers.9"): torch.zeros(8, 64)})),
        AdapterTargetModuleError,
        RejectCode.UNKNOWN_TARGET_MODULE,
    ),
    "rank_over_cap": (
        _edit_tensors(
            lambda t: t.update(
                {Q_A: torch.zeros(128, 64), Q_A.replace("lora_A", "lora_B"): torch.zeros(64, 128)}
            )
        ),
        AdapterRankTooLargeError,
        RejectCode.RANK_OVER_CAP,
    ),
    "wrong_in_features": (
        _edit_tensors(lambda t: t.update({Q_A: torch.zeros(8, 32)})),
        AdapterShapeError,
        RejectCode.SHAPE_MISMATCH,
    ),
    "missing_b": (
        _edit_tensors(lambda t: t.pop(Q_A.replace("lora_A", "lora_B"))),
        AdapterShapeError,
        RejectCode.SHAPE_MISMATCH,
    ),
    "nan": (_edit_tensors(_nan), AdapterNonFiniteError, RejectCode.NON_FINITE_WEIGHTS),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_adapter_is_rejected_with_its_own_error(
    case: str, good_adapter: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    edit, error, code = CASES[case]
    bad = tmp_path / "bad"
    shutil.copytree(good_adapter, bad)
    edit(bad)
    _, gpu, spec = build_lora_model(tiny_model_dir, {8: 2, 16: 1}, max_rank=64)
    cache = local_cache(spec, gpu, {"bad": bad, "good": good_adapter}, tmp_path / "cache")
    with pytest.raises(error) as info:
        await cache.own("bad", "gpu")
    assert type(info.value) is error and info.value.code == code
    # nothing half-loaded: no tier holds it and every slot of every layer is still zero
    assert cache.tier_of("bad") == "remote" and cache.state().gpu_adapters == []
    assert cache.state().ram_adapters == [] and cache.state().disk_adapters == []
    assert all(
        p.a.abs().sum() == 0 and p.b.abs().sum() == 0 for w in gpu.layers.values() for p in w.pools.values()
    )
    with pytest.raises(error) as merged:
        AdapterRegistry(spec, {"bad": bad}).read("bad")
    assert type(merged.value) is error and merged.value.code == code
    await cache.own("good", "gpu")  # the replica still accepts good adapters afterwards
    assert cache.tier_of("good") == "gpu"


def test_rank_cap_applies_to_tensor_shapes(good_adapter: Path, tiny_model_dir: Path) -> None:
    _, _, spec = build_lora_model(tiny_model_dir, {8: 1})
    capped = AdapterSpec(spec.num_layers, spec.shapes, max_rank=4, base_model_hash=TEST_BASE_HASH)
    with pytest.raises(AdapterRankTooLargeError):
        AdapterRegistry(capped, {"a": good_adapter}).read("a")


def test_every_artifact_rule_has_a_load_error_and_the_classes_have_distinct_codes() -> None:
    registration_only = {
        RejectCode.ARTIFACT_FORBIDDEN,
        RejectCode.CHECKSUM_MISMATCH,
        RejectCode.RANK_MISMATCH,
        RejectCode.TARGET_MODULES_MISMATCH,
        RejectCode.ALPHA_MISMATCH,
    }
    assert set(RULE_ERRORS) == set(RejectCode) - registration_only
    classes = {e for _, e, _ in CASES.values()} | {AdapterNotFoundError}
    assert len({c.code for c in classes}) == len(classes)


def test_unregistered_adapter_is_not_found(tiny_model_dir: Path) -> None:
    _, _, spec = build_lora_model(tiny_model_dir, {8: 1})
    with pytest.raises(AdapterNotFoundError):
        AdapterRegistry(spec, {}).read("../../etc")
