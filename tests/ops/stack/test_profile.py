"""The local profile sizes the KV cache for a laptop; the production sizing stays the documented default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lorafleet.model.prepare import ensure_default_model
from ops.stack.profile import LOCAL_REPLICA_ENV
from replica.config import ReplicaSettings

REPO = Path(__file__).resolve().parents[3]
GIB = 1 << 30


def _kv_bytes(settings: ReplicaSettings) -> int:
    """The replica's KV allocation on the CPU: its byte budget, in whole blocks (as the engine sizes it)."""
    from replica.kv.budget import blocks_in
    from replica.kv.paged_cache import bytes_per_block
    from replica.model.loader import read_config, resolve_dtype

    per_block = bytes_per_block(
        read_config(ensure_default_model()), settings.kv_block_size, resolve_dtype(settings.dtype)
    )
    return blocks_in(settings.kv_cache_bytes, per_block) * per_block


def test_the_local_profile_kv_cache_is_an_eighth_of_production(monkeypatch: pytest.MonkeyPatch) -> None:
    production = ReplicaSettings()
    for key, value in LOCAL_REPLICA_ENV.items():
        monkeypatch.setenv(key, value)
    local = ReplicaSettings()
    assert _kv_bytes(production) > 1.5 * GIB
    assert _kv_bytes(local) <= 0.4 * GIB
    assert sum(local.lora_slots.values()) < sum(production.lora_slots.values())
    assert max(local.lora_slots) == production.max_lora_rank  # every registrable rank still has a slot
    assert local.ram_budget_bytes < production.ram_budget_bytes
    assert local.disk_budget_bytes < production.disk_budget_bytes


def test_the_k8s_replica_sets_the_production_defaults() -> None:
    deployment = yaml.safe_load((REPO / "infra/k8s/replica-deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    defaults = ReplicaSettings()
    assert int(env["LORAFLEET_REPLICA_MAX_NUM_SEQS"]) == defaults.max_num_seqs
    assert int(env["LORAFLEET_REPLICA_MAX_MODEL_LEN"]) == defaults.max_model_len
    slots = {int(k): v for k, v in json.loads(env["LORAFLEET_REPLICA_LORA_SLOTS"]).items()}
    assert slots == defaults.lora_slots
    assert int(env["LORAFLEET_REPLICA_RAM_BUDGET_BYTES"]) == defaults.ram_budget_bytes
    assert int(env["LORAFLEET_REPLICA_DISK_BUDGET_BYTES"]) == defaults.disk_budget_bytes
