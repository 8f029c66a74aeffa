"""One production profile (lorafleet/sizing.py) holds the brief's sizes, and every place that runs a
production replica agrees with it: the replica's own defaults, the default pool in infra/k8s, the GPU
compose file and the simulator. The CPU compose file and the local stack run the local profile."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from lorafleet.sizing import BRIEF, GB, PRODUCTION, gpu_budget, problems
from ops.stack.profile import LOCAL_REPLICA_ENV
from replica.config import ReplicaSettings
from sim.profile_cli import app as profile_app
from sim.replica import CacheSizes
from tests.project.compose_files import compose, gpu_override, merge, services
from tests.project.k8s_files import containers, one

SIZE_NAMES = tuple(PRODUCTION.replica_env())


def _comparable(env: dict[str, str]) -> dict[str, object]:
    return {k: json.loads(v) if k.endswith("_LORA_SLOTS") else v for k, v in env.items()}


def _default_pool() -> dict[str, str]:
    """The literal env of the replica container of the StatefulSet the ScaledObject scales."""
    (container,) = [c for c in containers(include_init=False) if c.doc.name == "lora-replica-pool-default"]
    return container.literal_env()


def test_the_brief_arithmetic() -> None:
    assert BRIEF.adapter_bytes(16) == 39_976_960 * 2  # 80 MB in 16-bit
    assert BRIEF.kv_bytes_per_token == 524_288
    assert round(BRIEF.kv_bytes_needed / GB, 1) == 33.6
    assert BRIEF.owned_per_replica == 385
    assert round(BRIEF.registry_bytes / GB) == 400


def test_the_production_profile_meets_the_brief_on_an_80_gb_gpu() -> None:
    assert problems(PRODUCTION) == []
    assert PRODUCTION.lora_slots[16] >= 250
    assert PRODUCTION.dtype == "bfloat16"
    budget = gpu_budget(PRODUCTION)
    assert budget.base + budget.slots + budget.kv == budget.usable
    assert budget.kv >= BRIEF.kv_bytes_needed  # 32 requests of 2,000 tokens fit beside 250+ slots
    assert PRODUCTION.ram_budget_bytes >= BRIEF.owned_per_replica * BRIEF.adapter_bytes(16)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"lora_slots": {16: 249, 32: 8, 64: 4}}, "rank-16 slots"),
        ({"lora_slots": {16: 250, 32: 8}}, "no slot pool holds rank 64"),
        ({"lora_slots": {16: 250, 32: 40, 64: 20}}, "KV cache"),
        ({"ram_budget_bytes": 16 << 30}, "RAM tier"),
        ({"gpu_memory_utilization": 0.97}, "activations"),
    ],
)
def test_the_arithmetic_refuses_a_profile_off_the_brief(change: dict, why: str) -> None:
    found = problems(replace(PRODUCTION, **change))
    assert any(why in p for p in found), found


def test_the_replicas_defaults_are_the_production_profile() -> None:
    fields = ReplicaSettings.model_fields
    for variable, value in _comparable(PRODUCTION.replica_env()).items():
        name = variable.removeprefix("LORAFLEET_REPLICA_").lower()
        default = fields[name].get_default(call_default_factory=True)
        if name == "dtype":
            assert ReplicaSettings.model_construct(dtype=default).model_dtype("cuda") == value
            assert ReplicaSettings.model_construct(dtype=default).model_dtype("cpu") == "float32"
        elif name == "device":
            assert default in ("auto", value)
        elif name == "lora_slots":
            assert default == {int(k): n for k, n in value.items()}  # type: ignore[union-attr]
        else:
            assert str(default) == str(value), variable


def test_the_kubernetes_default_pool_sets_the_production_profile() -> None:
    env = _comparable(_default_pool())
    assert {k: env.get(k) for k in SIZE_NAMES} == _comparable(PRODUCTION.replica_env())


def test_the_kubernetes_pool_has_room_for_its_tiers() -> None:
    statefulset = one("StatefulSet", "lora-replica-pool-default").body
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    storage = claim["spec"]["resources"]["requests"]["storage"]
    assert storage.endswith("Gi") and int(storage[:-2]) << 30 >= PRODUCTION.disk_budget_bytes
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    memory = container["resources"]["requests"]["memory"]
    assert memory.endswith("Gi") and int(memory[:-2]) << 30 > PRODUCTION.ram_budget_bytes


def test_the_gpu_compose_file_sets_the_production_profile_and_the_cpu_one_the_local_profile() -> None:
    gpu = services(merge(compose(), gpu_override()))
    cpu = services()
    for name, service in gpu.items():
        if service.process in ("replica serve", "autoscale"):
            env = _comparable(service.env())
            assert {k: env.get(k) for k in SIZE_NAMES} == _comparable(PRODUCTION.replica_env()), name
    for name, service in cpu.items():
        if service.process == "replica serve":
            assert _comparable(service.env()).items() >= _comparable(LOCAL_REPLICA_ENV).items(), name


def test_the_simulators_default_cache_is_the_production_profile() -> None:
    sizes = CacheSizes()
    assert (sizes.rank, sizes.gpu_slots) == (16, PRODUCTION.lora_slots[16])
    assert sizes.ram_bytes == PRODUCTION.ram_budget_bytes
    assert sizes.disk_bytes == PRODUCTION.disk_budget_bytes
    assert sizes.adapter_bytes == BRIEF.adapter_bytes(16)


def test_the_simulate_commands_defaults_are_the_simulators() -> None:
    from sim.cli import simulate_cmd

    defaults = simulate_cmd.__defaults__ or ()
    names = simulate_cmd.__code__.co_varnames[: simulate_cmd.__code__.co_argcount]
    given = dict(zip(names[-len(defaults) :], defaults, strict=True))
    sizes = CacheSizes()
    assert given["gpu_slots"] == sizes.gpu_slots
    assert round(given["ram_gb"] * 1e9) == sizes.ram_bytes
    assert round(given["disk_gb"] * 1e9) == sizes.disk_bytes
    assert round(given["adapter_mb"] * 1e6) == sizes.adapter_bytes


def test_profile_show_production_prints_every_source_agreeing() -> None:
    result = CliRunner().invoke(profile_app, ["show", "production"])
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    for source in ("profile", "replica defaults", "infra/k8s", "docker-compose.gpu.yml", "simulator"):
        assert source in header
    slots = next(r for r in rows if r.startswith("LORAFLEET_REPLICA_LORA_SLOTS"))
    assert slots.count('{"16":250,"32":8,"64":4}') == 4 and '{"16":250}' in slots
    assert not [r for r in rows if r.startswith("DISAGREES")]


def test_profile_show_production_fails_when_a_source_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.replica

    monkeypatch.setattr(sim.replica, "CacheSizes", lambda: CacheSizes(gpu_slots=100))
    result = CliRunner().invoke(profile_app, ["show", "production"])
    assert result.exit_code == 1
    assert re.search(r"DISAGREES: simulator: LORAFLEET_REPLICA_LORA_SLOTS is \{16: 100\}", result.output)
