"""The registry's verdict on a fetched artifact: the checksum first, the shared adapter rules, then the
registration against the files; rsLoRA and per-module patterns pass."""

from __future__ import annotations

import pytest

from gateway.registry.validator.artifact_checks import verify_artifact
from gateway.registry.validator.artifact_fetch import Artifact as Fetched
from lorafleet.adapter_rules.errors import AdapterRejected
from schemas.events import AdapterRegistered
from tests.lorafleet.adapter_rules.artifacts import MAX_RANK, SERVED, SPEC, Artifact, build


def _event(art: Artifact, **changes: object) -> AdapterRegistered:
    fields = dict(
        adapter_id="acme-a",
        tenant_id="acme",
        version=1,
        base_model_hash=SERVED,
        rank=art.rank,
        alpha=art.alpha,
        target_modules=art.modules,
        weights_uri="s3://lorafleet-adapters/adapters/acme/acme-a",
        checksum=art.checksum,
    )
    return AdapterRegistered(**{**fields, **changes})


def _verdict(art: Artifact, **changes: object) -> str:
    try:
        verify_artifact(Fetched(art.config, art.weights), _event(art, **changes), SPEC, MAX_RANK, SERVED)
    except AdapterRejected as exc:
        return exc.code.value
    return "accepted"


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"use_rslora": True},
        {"alpha_pattern": {"v_proj": 3.0}},
        {
            "rank_pattern": {"layers.1.self_attn.q_proj": 1},
            "alpha_pattern": {"q_proj": 4},
            "use_rslora": True,
        },
    ],
    ids=["plain", "rslora", "alpha_pattern", "all_of_them"],
)
def test_rslora_and_per_module_patterns_are_accepted(config: dict) -> None:
    assert _verdict(build(config)) == "accepted"


def test_the_checksum_is_checked_before_the_bytes_are_parsed() -> None:
    art = build({}, weights=lambda _b: b"\x80\x04garbage")
    assert _verdict(art, checksum="sha256:" + "0" * 64) == "checksum_mismatch"
    assert _verdict(art) == "unsupported_format"


def test_the_registration_must_describe_the_files() -> None:
    art = build({"rank_pattern": {"v_proj": 3}})
    assert art.rank == 3
    assert _verdict(art, rank=2) == "rank_mismatch"
    assert _verdict(art, alpha=16.0) == "adapter_config_mismatch"
    assert _verdict(art, target_modules=["q_proj"]) == "target_modules_mismatch"


def test_config_and_registration_must_name_the_same_base() -> None:
    art = build({"base_model_hash": "sha256:" + "7" * 64})
    assert _verdict(art) == "base_model_mismatch"
    assert _verdict(build({"base_model_hash": SERVED})) == "accepted"
