"""The local profile sizes a replica for a laptop; the production profile stays the replica's default."""

from __future__ import annotations

import pytest

from lorafleet.sizing import PRODUCTION
from ops.stack.env import process_env
from ops.stack.profile import LOCAL_REPLICA_ENV
from replica.config import ReplicaSettings

GIB = 1 << 30


def _local(monkeypatch: pytest.MonkeyPatch) -> ReplicaSettings:
    """The settings a replica builds from the local profile's variables."""
    for name, value in LOCAL_REPLICA_ENV.items():
        monkeypatch.setenv(name, value)
    return ReplicaSettings()


def test_the_local_profile_is_a_fraction_of_production_with_every_rank_still_servable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = _local(monkeypatch)
    assert local.kv_cache_bytes <= 0.4 * GIB
    assert sum(local.lora_slots.values()) < sum(PRODUCTION.lora_slots.values()) / 10
    assert max(local.lora_slots) == PRODUCTION.max_lora_rank  # every registrable rank still has a slot
    assert local.ram_budget_bytes < PRODUCTION.ram_budget_bytes / 10
    assert local.disk_budget_bytes < PRODUCTION.disk_budget_bytes / 10


def test_the_local_stack_gives_its_processes_the_local_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LOCAL_REPLICA_ENV:
        monkeypatch.delenv(name, raising=False)
    assert process_env().items() >= LOCAL_REPLICA_ENV.items()
