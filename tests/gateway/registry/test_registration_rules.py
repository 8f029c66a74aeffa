"""The field checks shared by both registration doors: each bad field gets its own code."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRegistration
from gateway.registry.registration_rules import RegistryRules, check_fields

BASE = "sha256:" + "ab" * 32
RULES = RegistryRules.build(BASE, 64, ["s3://lorafleet-adapters/", "file:///tmp/adapters", "s3://10.0.0.1/"])
GOOD = {
    "base_model_hash": BASE,
    "rank": 16,
    "target_modules": ["q_proj", "v_proj"],
    "weights_uri": "s3://lorafleet-adapters/acme/v1",
    "checksum": "sha256:" + "0" * 64,
}


def test_a_good_registration_passes_and_names_its_folder() -> None:
    assert check_fields(RULES, **GOOD).key == "acme/v1"


def test_unusable_configured_prefixes_are_ignored() -> None:
    assert [p.bucket for p in RULES.prefixes] == ["lorafleet-adapters"]


@pytest.mark.parametrize(
    "change, code",
    [
        ({"checksum": "sha256:" + "0" * 63}, "invalid_checksum"),
        ({"checksum": "md5:" + "0" * 32}, "invalid_checksum"),
        ({"checksum": "sha256:" + "A" * 64}, "invalid_checksum"),
        ({"base_model_hash": "sha256:" + "cd" * 32}, "base_model_mismatch"),
        ({"rank": 65}, "adapter_rank_exceeds_limit"),
        ({"target_modules": ["q_proj", "lm_head"]}, "unknown_target_module"),
        ({"target_modules": ["q_proj", "q_proj"]}, "unknown_target_module"),
        ({"weights_uri": "file:///etc/passwd"}, "invalid_weights_uri"),
    ],
)
def test_each_bad_field_has_its_own_code(change: dict, code: str) -> None:
    with pytest.raises(InvalidRegistration) as info:
        check_fields(RULES, **{**GOOD, **change})
    assert info.value.code == code
