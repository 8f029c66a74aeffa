"""A whole adapter artifact, checked in the one order both doors use.

check_files (the folder listing), then check_artifact: the config, the base hash, the safetensors header,
the tensors against the base and the config, then (unless the caller runs its own pass over the same bytes
and reports through first_non_finite) the NaN/Inf check. The first failure is the artifact's code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lorafleet.adapter_rules.base_spec import ModelShapes
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.adapter_rules.finite import check_finite
from lorafleet.adapter_rules.lora_tensors import AdapterPlan, check_tensors
from lorafleet.adapter_rules.peft_config import AdapterConfig, parse_adapter_config
from lorafleet.adapter_rules.safetensors_header import Header, TensorEntry, parse_header
from schemas.api import ADAPTER_CONFIG_NAME as CONFIG_NAME
from schemas.api import ADAPTER_WEIGHTS_NAME as WEIGHTS_NAME

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def check_files(names: Iterable[str]) -> None:
    """A PEFT folder's file names (relative, subfolders included): no pickle anywhere, both files there."""
    listed = set(names)
    pickles = sorted(n for n in listed if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise AdapterRejected(
            RejectCode.UNSUPPORTED_FORMAT, f"pickle files are refused: {pickles[:5]}", WEIGHTS_NAME
        )
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if name not in listed:
            raise AdapterRejected(
                RejectCode.ARTIFACT_MISSING, f"{name} is missing from the adapter folder", name
            )


def check_base(served: str, registered: str | None, declared: str | None) -> None:
    """The base the adapter was trained on is the served one: the registration's hash, else the config's;
    when both are given they agree."""
    if registered and declared and registered != declared:
        raise AdapterRejected(
            RejectCode.BASE_MODEL_MISMATCH,
            f"{CONFIG_NAME} names base {declared[:80]}, the registration {registered[:80]}",
            "base_model_hash",
        )
    trained_on = registered or declared
    if not trained_on:
        raise AdapterRejected(
            RejectCode.BASE_MODEL_MISMATCH,
            "the adapter does not declare the base it was trained on",
            "base_model_hash",
        )
    if trained_on != served:
        raise AdapterRejected(
            RejectCode.BASE_MODEL_MISMATCH,
            f"adapter trained on base {trained_on[:80]}, the served base is {served}",
            "base_model_hash",
        )


@dataclass(frozen=True)
class CheckedAdapter:
    """An artifact that passed: its config, its header and its per-module plan."""

    config: AdapterConfig
    header: Header
    plan: AdapterPlan

    def tensors(self) -> list[TensorEntry]:
        """Every tensor in plan order (per module, lora_A then lora_B)."""
        return [t for m in self.plan.modules.values() for t in (m.a, m.b)]


def check_artifact(
    config: bytes,
    weights: bytes | bytearray | memoryview,
    spec: ModelShapes,
    max_rank: int,
    served_base_hash: str,
    registered_base_hash: str | None,
    check_values: bool = True,
) -> CheckedAdapter:
    """Run every rule on the two files' bytes; AdapterRejected with the first failure's code."""
    cfg = parse_adapter_config(config)
    header = parse_header(weights)
    checked = CheckedAdapter(cfg, header, check_tensors(header, cfg, spec, max_rank))
    # After the rank and module checks: the registry checks a registration's declared rank and modules
    # before it fetches anything, so an artifact failing both ways is refused for the same reason at both.
    check_base(served_base_hash, registered_base_hash, cfg.base_model_hash)
    if check_values:
        check_finite(weights, checked.tensors())
    return checked
