"""The field checks every registration passes, at the HTTP door and again in the registry validator.

Each failure raises InvalidRegistration with its own machine code; the validator stores that code as the
version's reason_code. Codes shared with the artifact checks come from the one table
(lorafleet.adapter_rules.errors.RejectCode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.errors import InvalidRegistration
from gateway.registry.weights_uri import ObjectLocation, confine, parse_prefix
from lorafleet.adapter_rules.errors import RejectCode
from schemas.ids import SHA256_RE
from schemas.llama import LLAMA_MODULES

log = logging.getLogger(__name__)

INVALID_CHECKSUM = "invalid_checksum"


@dataclass(frozen=True)
class RegistryRules:
    """The served base hash, the fleet's rank cap, the adaptable modules and the allowed prefixes."""

    served_base_hash: str
    max_rank: int
    modules: frozenset[str]
    prefixes: tuple[ObjectLocation, ...]

    @classmethod
    def build(cls, served_base_hash: str, max_rank: int, prefixes: list[str]) -> RegistryRules:
        parsed = []
        for prefix in prefixes:
            try:
                parsed.append(parse_prefix(prefix))
            except InvalidRegistration as exc:
                log.warning("ignoring object-store prefix %r: %s", prefix, exc.message)
        return cls(served_base_hash, max_rank, frozenset(LLAMA_MODULES), tuple(parsed))


def check_fields(
    rules: RegistryRules,
    *,
    base_model_hash: str,
    rank: int,
    target_modules: list[str],
    weights_uri: str,
    checksum: str,
) -> ObjectLocation:
    """Raise InvalidRegistration for the first bad field; return where the artifact lives."""
    if not SHA256_RE.fullmatch(checksum):
        raise InvalidRegistration(
            INVALID_CHECKSUM, "checksum must be 'sha256:' followed by 64 lowercase hex digits", "checksum"
        )
    if base_model_hash != rules.served_base_hash:
        raise InvalidRegistration(
            RejectCode.BASE_MODEL_MISMATCH.value,
            f"base_model_hash {base_model_hash[:80]!r} is not the served base {rules.served_base_hash}",
            "base_model_hash",
        )
    if rank > rules.max_rank:
        raise InvalidRegistration(
            RejectCode.RANK_OVER_CAP.value, f"rank {rank} exceeds the fleet cap {rules.max_rank}", "rank"
        )
    unknown = sorted(set(target_modules) - rules.modules)
    if unknown or len(set(target_modules)) != len(target_modules):
        raise InvalidRegistration(
            RejectCode.UNKNOWN_TARGET_MODULE.value,
            f"target_modules {unknown or target_modules} not in {sorted(rules.modules)} (or repeated)",
            "target_modules",
        )
    return confine(weights_uri, list(rules.prefixes))
