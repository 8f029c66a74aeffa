"""The registry's verdict on a fetched artifact: its checksum, the shared adapter rules
(lorafleet.adapter_rules, the ones the replica loads with), then the registration against the files.

A registration passes when the weights hash to its checksum, the artifact passes every adapter rule on the
served base within the fleet's rank cap, and its fields describe the files: rank is the tensors' largest
rank, alpha is the config's lora_alpha, target_modules are the modules the tensors adapt.
"""

from __future__ import annotations

import hashlib

from gateway.registry.validator.artifact_fetch import Artifact
from lorafleet.adapter_rules.artifact import CheckedAdapter, check_artifact
from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from schemas.events import AdapterRegistered


def check_registration(checked: CheckedAdapter, rank: int, alpha: float, target_modules: list[str]) -> None:
    """The registration's rank, alpha and target_modules are the artifact's."""
    if checked.plan.rank != rank:
        raise AdapterRejected(
            RejectCode.RANK_MISMATCH, f"tensors have rank {checked.plan.rank}, registered {rank}", "rank"
        )
    if checked.config.lora_alpha != float(alpha):
        raise AdapterRejected(
            RejectCode.ALPHA_MISMATCH,
            f"lora_alpha {checked.config.lora_alpha} differs from the registered alpha {alpha}",
            "alpha",
        )
    if checked.plan.module_names != frozenset(target_modules):
        raise AdapterRejected(
            RejectCode.TARGET_MODULES_MISMATCH,
            f"tensors adapt {sorted(checked.plan.module_names)}, registered {sorted(target_modules)}",
            "target_modules",
        )


def verify_artifact(
    artifact: Artifact, event: AdapterRegistered, spec: BaseSpec, max_rank: int, served_base_hash: str
) -> None:
    """Every check on a fetched artifact, in order; AdapterRejected with the first failure's code."""
    digest = "sha256:" + hashlib.sha256(artifact.weights).hexdigest()
    if digest != event.checksum:
        raise AdapterRejected(
            RejectCode.CHECKSUM_MISMATCH, "adapter_model.safetensors does not match checksum", "checksum"
        )
    checked = check_artifact(
        artifact.config, artifact.weights, spec, max_rank, served_base_hash, event.base_model_hash
    )
    check_registration(checked, event.rank, event.alpha, event.target_modules)
